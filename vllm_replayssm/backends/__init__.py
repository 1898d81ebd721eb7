"""Attention-backend subclasses: what our layers need in their metadata beyond vLLM's."""
