"""SPATL (Yu et al. 2022): shared encoder, private predictors, RL salient
channel selection, gradient control (`spatl.py`); its TFF computations
(`computations.py`) and its agent (`agent.py`)."""
