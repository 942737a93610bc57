"""The status page's parts: routes, views, their HTML and JSON, forms and who may use them."""
