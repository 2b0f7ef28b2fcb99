"""Training: cold-start data (coldstart), SFT through LLaMA-Factory (sft), RL (rl, openrlhf).

Nothing below this layer imports it."""
