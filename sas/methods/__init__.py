"""The seed methods as Dynamic operators: SANTA, SpecAttn, Saap and Kascade (one module each).

Each method keeps its algorithm, its exact PyTorch reference and its host-side state here;
kernel text lives in templates/, the op-chain hooks in sas.dynamic. See docs/dynamic.md
section 6 and /work/shared/methods for the specs.
"""
