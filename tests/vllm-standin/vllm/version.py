# vsnap stand-in: the version of the vLLM wheel whose vllm/snapshot package it runs.
__version__ = "0.33.0"
__version_tuple__ = (0, 33, 0)
