"""minferd: several quantized GGUF models co-resident on one GPU, served over gRPC."""
__version__ = "0.1.0"
