"""Draft-model speculative decoding: a small draft proposes k tokens, the target verifies
them in one forward pass (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023, arXiv
2302.01318)."""
