"""Config: YAML files -> frozen, validated models; every error names file, line,
job and field."""
