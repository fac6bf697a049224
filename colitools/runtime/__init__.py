"""Minimal numpy reference runtime for converted containers and float / FP8 checkpoints.

```python
from colitools.runtime import load_model
with load_model("out/model", cap=2) as model:
    ids = model.generate([3, 17, 42], max_new_tokens=16)
    argmax, last_logits = model.score([3, 17, 42, *ids])
```
"""

from colitools.runtime.config import ModelArgs
from colitools.runtime.generate import GenerationResult, generate, score
from colitools.runtime.model import Model, load_model

__all__ = ["GenerationResult", "Model", "ModelArgs", "generate", "load_model", "score"]
