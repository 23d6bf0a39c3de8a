# vsnap stand-in for vLLM (see tests/vllm-standin/README.md).
