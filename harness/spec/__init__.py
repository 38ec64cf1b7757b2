"""1. The spec: YAML files parsed with a safe loader into frozen, validated objects."""
