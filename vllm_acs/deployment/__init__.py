"""A deployment of many nodes: the model registry, and forwarding to the node serving a model."""
