"""mini-deepep."""
