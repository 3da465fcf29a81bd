#!/usr/bin/env bash
# The main job, what `make demo` runs after scripts/setup.sh: the whole PASTA pipeline at toy scale on the embedded
# SmolLM2-135M-Instruct, offline, on a CPU:
#   annotate (structural teacher) -> SFT -> Baseline-SFT -> one preference round -> AlpacaEval-style evaluation
# and the final table. Every stage resumes: rerunning after a kill picks up where it stopped, and a finished
# training stage is not trained again.
#
#   scripts/demo.sh                          # writes outputs/demo/
#   PASTA_DEMO_DIR=/tmp/demo scripts/demo.sh
#
# Toy scale on purpose (the 39 of the 80 hand-written records whose annotation holds promises, a few LoRA epochs,
# 8 evaluation prompts, a 135M model, offline quality proxies): it shows every stage working end to end, not the paper's
# numbers. docs/full-scale.md says how to run the real thing. The sizes below can be changed through the
# environment (the test suite runs the same script on a tiny random model).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PASTA_VENV:-.venv}/bin/python
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
out=${PASTA_DEMO_DIR:-outputs/demo}
model=${PASTA_DEMO_MODEL:-smollm2-135m}            # the student
num_records=${PASTA_DEMO_RECORDS:-80}               # sample records read (SFT keeps those with promises)
sft_epochs=${PASTA_DEMO_SFT_EPOCHS:-4}
max_length=${PASTA_DEMO_MAX_LENGTH:-192}            # SFT/preference rows per example
num_prompts=${PASTA_DEMO_PREF_PROMPTS:-8}           # preference prompts (N samples each)
num_samples=${PASTA_DEMO_SAMPLES:-4}
num_eval=${PASTA_DEMO_EVAL_PROMPTS:-8}              # evaluation prompts
max_new_tokens=${PASTA_DEMO_MAX_NEW_TOKENS:-160}

# Hydra's run folders (logs, resolved configs) go beside the demo's outputs.
common=("paths.output_root=$out" device=cpu "model=$model")
train=("${common[@]}" "data.path=$out/annotated.jsonl" "data.limit=$num_records" "stage.max_length=$max_length"
    resume=true)
# No win rate: the only judge offline is a 135M model, whose verdicts hardly discriminate (docs/judges.md); the
# quality numbers are the offline proxies, labelled as such (the plot's axis: embedding similarity).
evaluate=("${common[@]}" eval_data=sample "eval.limit=$num_eval" "decode.max_new_tokens=$max_new_tokens"
    eval.win_rate=false)
started=$SECONDS

step() { printf '\n== [%4d s] %s\n' $((SECONDS - started)) "$*"; }
# A finished training stage is not trained again on a rerun (a killed one resumes from its last checkpoint).
# Done: the run's train_info.json says so, written after its last model, metrics and checks (a run killed after
# its final model but before them resumes and writes them).
done_already() {
    "$python" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])).get("status") != "done")' \
        "$1/train_info.json" 2>/dev/null && echo "   already done: $1"
}

step "1/8 prepare the embedded model (converted once into the cache)"
"$python" -m pasta.models prepare "model=$model"

step "2/8 annotate the embedded sample with the structural teacher (rule-based, no model)"
"$python" -m pasta.annotate "${common[@]}" teacher=structural data=sample on_reject=keep_unannotated \
    output="$out/annotated.jsonl"

step "3/8 SFT: learn PASTA-LANG on the annotated records (LoRA, the decoder's attention layout)"
done_already "$out/sft" || "$python" -m pasta.train experiment=cpu_sft "${train[@]}" \
    "stage.num_train_epochs=$sft_epochs" output_dir="$out/sft"

step "4/8 Baseline-SFT: the same records with the annotations stripped (the sequential comparison model)"
done_already "$out/baseline-sft" || "$python" -m pasta.train experiment=cpu_sft "${train[@]}" \
    "stage.num_train_epochs=$sft_epochs" data.strip_annotations=true output_dir="$out/baseline-sft"

step "5/8 one preference round: sample, score speed + quality (embedding judge), train on best vs worst"
done_already "$out/pref" || "$python" -m pasta.train experiment=cpu_pref "${train[@]}" \
    model.path="$out/sft/final" "stage.prompts_per_round=$num_prompts" "stage.num_samples=$num_samples" \
    "stage.max_new_tokens=$max_new_tokens" output_dir="$out/pref"

step "6/8 evaluate Baseline-SFT, decoded sequentially (batch 1, wall-clock timed)"
"$python" -m pasta.eval "${evaluate[@]}" model.path="$out/baseline-sft/final" decode=sequential \
    eval.generator=baseline-sft output_dir="$out/eval/baseline-sft"

step "7/8 evaluate the PASTA models, decoded asynchronously, against Baseline-SFT"
for run in sft pref/round-1; do
    "$python" -m pasta.eval "${evaluate[@]}" model.path="$out/$run/final" decode=async \
        eval.reference="$out/eval/baseline-sft" eval.sequential="$out/eval/baseline-sft" \
        eval.generator="pasta-${run//\//-}" output_dir="$out/eval/pasta-${run//\//-}"
done

step "8/8 report: table and speedup-vs-quality-proxy plot"
"$python" -m pasta.eval "${common[@]}" report="$out/eval/*" output_dir="$out/report"

cat <<EOF

== done in $((SECONDS - started)) s. Outputs: $out/ (report: $out/report/, plot: $out/report/pareto.png)
This was a toy run: the hand-written records with promises, model $model, $sft_epochs LoRA epochs, $num_eval evaluation
prompts and offline quality proxies (no judge). Its numbers show the pipeline working, not the paper's results. For the real
thing (a strong teacher, a 7B student on GPUs, AlpacaEval's 805 prompts and a GPT-4 judge) see docs/full-scale.md
(linked from README.md).
EOF
