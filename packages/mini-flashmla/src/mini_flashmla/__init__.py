"""mini-flashmla."""
