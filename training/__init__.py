"""How the shipped model (models/nemotron-h-pycode) is made: data, training run, folder."""
