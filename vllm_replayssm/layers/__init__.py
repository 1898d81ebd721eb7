"""vLLM layer subclasses that carry ReplaySSM (registered with PluggableLayer.register_oot)."""
