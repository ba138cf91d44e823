"""One forward pass per architecture, chosen by general.architecture."""
from minferd.model.arch.gemma3 import Gemma3Model
from minferd.model.arch.gpt_oss import GptOssModel
from minferd.model.arch.llama import LlamaModel
from minferd.model.arch.qwen2 import Qwen2Model
from minferd.model.arch.qwen2moe import Qwen2MoeModel
from minferd.model.arch.qwen3 import Qwen3Model
from minferd.model.arch.qwen3moe import Qwen3MoeModel

MODELS = {"llama": LlamaModel, "qwen2": Qwen2Model, "qwen3": Qwen3Model, "gemma3": Gemma3Model,
          "qwen3moe": Qwen3MoeModel, "qwen2moe": Qwen2MoeModel, "gpt-oss": GptOssModel}
