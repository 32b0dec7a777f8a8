"""SPATL's encoder / predictor split of the paper's models: the classifier
is the predictor, every other layer the encoder, and the agent's graph of
the encoder finds the convolutions (and dense layers) it prunes."""

import pytest

from tff_hetero import models
from tff_hetero.algorithms.spatl import agent
from tff_hetero.errors import ModelError


@pytest.mark.parametrize(
  "name, shape, prunable",
  [
    # ResNet-20: the stem and 2 convolutions in each of 9 blocks (option-A
    # shortcuts have none).
    ("resnet20", (32, 32, 3), 19),
    # The 2-layer CNN: conv1, conv2 and the hidden dense layer.
    ("mnist_cnn", (28, 28, 1), 3),
  ],
)
def test_classifier_is_the_predictor(name, shape, prunable):
  model = models.build_model(name, shape, 10, seed=0)
  encoder, predictor = models.encoder_predictor_split(name, model)
  assert predictor == ("logits",)
  assert set(encoder) | set(predictor) == {layer.name for layer in model.layers}
  assert not set(encoder) & set(predictor)
  graph = agent.layer_graph(model, list(encoder))
  assert len(graph.prunable_names) == prunable
  assert "logits" not in graph.prunable_names


def test_a_model_without_the_predictor_layer_is_refused():
  model = models.build_model("resnet8", (32, 32, 3), 10, seed=0)
  model.get_layer("logits")._name = "head"
  with pytest.raises(ModelError, match="no predictor layer"):
    models.encoder_predictor_split("resnet8", model)
