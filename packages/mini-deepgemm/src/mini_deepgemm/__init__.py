"""mini-deepgemm."""
