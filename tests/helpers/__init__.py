"""What the tests share: harnesses, servers, clients, builders.

No test module imports another; what two of them need lives here.
"""
