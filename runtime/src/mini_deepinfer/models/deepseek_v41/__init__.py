"""DeepSeek-V4.1: config, reference model, checkpoint format."""
