"""SFT through LLaMA-Factory: data export, the shared chat template, the YAML writer and launcher."""
