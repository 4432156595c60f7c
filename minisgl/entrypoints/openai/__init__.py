"""The OpenAI-compatible API: protocol models and the completions / chat handlers."""
