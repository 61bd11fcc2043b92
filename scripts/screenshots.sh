#!/usr/bin/env bash
# Regenerates the README's screenshots of ctxplan-gui (docs/gui-*.png), one per panel, by
# driving the app headless through state files under Xvfb. Usage:
#   bash scripts/screenshots.sh [build dir, default build]
# Needs the GUI built (scripts/build.sh does it where GLFW + imgui are installed) and xvfb-run.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
gui="$build/gui/ctxplan-gui"
cli="$build/planner/ctxplan"
if [ ! -x "$gui" ] || [ ! -x "$cli" ]; then
  cmake --build "$build" --target ctxplan-gui ctxplan -j"$(nproc 2>/dev/null || echo 2)"
fi
gui=$(realpath "$gui")
command -v xvfb-run >/dev/null || { echo "screenshots: xvfb-run not found (bash scripts/setup.sh installs xvfb)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
profiles="$PWD/profiles"

# A report to overlay on the measured-vs-predicted panel: the same job priced for the
# hf-deepspeed runtime (until a ctxrun report is at hand, it shows how the overlay reads).
"$cli" --profiles "$profiles" predict --runtime hf-deepspeed --json > "$work/report.json" || true

shoot() {  # name, state JSON
  local name=$1 state=$2
  printf '%s\n' "$state" > "$work/$name.json"
  (cd "$work" && xvfb-run -a -s "-screen 0 1600x1000x24" "$gui" --profiles "$profiles" --no-settings \
      --size 1600x1000 --frames 5 --state "$work/$name.json" --screenshot "$work/$name.png" >/dev/null)
  cp "$work/$name.png" "docs/gui-$name.png"
  echo "docs/gui-$name.png"
}

mkdir -p docs
shoot memory   '{"view": {"tab": "memory"}, "search": false}'
shoot cpwork   '{"view": {"tab": "cpwork"}, "inputs": {"seq": 1048576, "docs": {"mode": "histogram", "bins": [[2048, 0.6], [32768, 0.3], [524288, 0.1]]}}, "plan": "cp=8,cp_kind=zigzag,zero=3,recompute=full,ckpt_offload=1,tiled_loss=256", "search": false}'
shoot plans    '{"view": {"tab": "plans"}, "inputs": {"seq": 131000}}'  # 131000 tokens: the note on plans whose layout does not divide it
shoot pareto   '{"view": {"tab": "pareto"}}'
shoot timeline '{"view": {"tab": "timeline"}, "plan": "cp=8,cp_kind=ring,zero=3,recompute=selective,tiled_loss=2048", "search": false}'
shoot maxseq   '{"view": {"tab": "maxseq", "maxseq_max_gpus": 256}, "search": false}'
shoot measured "{\"view\": {\"tab\": \"measured\"}, \"measured\": \"$work/report.json\", \"search\": false}"
printf '{"hidden_size": 4096, "num_attention_heads": 32,, }\n' > "$work/config.json"
shoot error    "{\"view\": {\"tab\": \"memory\"}, \"inputs\": {\"model\": \"$work/config.json\"}, \"search\": false}"
