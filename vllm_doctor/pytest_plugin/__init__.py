"""pytest plugin (entry point ``pytest11``): run vllm-doctor checks from a model author's tests."""
