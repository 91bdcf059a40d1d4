"""mini-deepinfer: the runtime."""
