"""Bytes to pixels: images on the CPU (Pillow) or the GPU (nvJPEG), video frames, and their throughput."""
