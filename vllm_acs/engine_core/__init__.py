"""What the plugin runs in vLLM's EngineCore process: the live-first scheduler."""
