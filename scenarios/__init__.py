"""Shipped scenarios, one TOML file each; `mlamem scenarios` lists them."""
