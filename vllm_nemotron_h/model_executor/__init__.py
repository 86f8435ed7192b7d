"""The plugin's Nemotron-H model: decoder layers, Mamba2 mixer, state cache manager."""
