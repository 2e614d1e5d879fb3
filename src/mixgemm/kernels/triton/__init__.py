"""mixgemm's Triton kernels. Weight-only GEMM on tensor cores: gemm.py (kernel + host wrapper), its shared
dequantize primitive dequant.py and its weight layout layout.py. Other modules here belong to other ops."""
