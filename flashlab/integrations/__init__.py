"""flashlab inside other libraries' models: adapters that register `flashlab.attention` where a
library looks attention functions up by name (`flashlab.integrations.transformers`)."""
