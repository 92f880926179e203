"""safe-serve: start vLLM or SGLang on a GPU so that it fits, and say why.

Data flows one way: probe -> model -> plan -> engine adapter -> supervisor.
"""

__version__ = "0.1.0"
