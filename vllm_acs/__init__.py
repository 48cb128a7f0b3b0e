"""vllm_acs: a vLLM plugin that makes every `vllm serve` process a research API node.

Public facade. Importing it is cheap: no vLLM, torch or FastAPI import happens here.
"""

__version__ = "0.1.0"
