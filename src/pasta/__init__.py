"""pasta: learned asynchronous decoding (PASTA, "Learning to Keep a Promise", ICML 2025, arXiv 2502.11517).

A model learns to mark the independent parts of its answer with PASTA-LANG tags; an interpreter decodes those
parts in parallel. Stages: ``python -m pasta.annotate`` -> ``python -m pasta.train stage=sft`` ->
``python -m pasta.train stage=pref`` -> ``python -m pasta.eval``; ``python -m pasta.generate`` decodes prompts.
"""

__version__ = "0.1.0"
