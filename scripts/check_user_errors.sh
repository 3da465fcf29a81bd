#!/usr/bin/env bash
# A hostile user's mistakes against every entry point (the examples of issues 18, 29 and 36, and their classes): each
# case must end with one `error:` line and exit code 2, or succeed where the input is valid; never a traceback, and
# no key that an endpoint echoed back (in an error body or an answer) in any output or file. Prints PASS/FAIL per
# case and "passed N of M".
#
#   scripts/check_user_errors.sh              # 108 checks on the tiny model, offline
#   PASTA_VENV=/path/to/venv scripts/check_user_errors.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
P="${PASTA_VENV:-.venv}/bin/python"
R=$(mktemp -d); O=$R/out; mkdir -p $O
trap 'rm -rf "$R"' EXIT
export OPENAI_API_KEY=sk-test-SECRETKEY1234567890
# Input files a user might hand in.
printf '{"instruction": "a", "output": "b\xff\xfe"}\n' > $R/bad_utf8.jsonl
printf '[{"instruction": "a", "output": "b\xff"}]' > $R/bad_utf8.json
printf '{"instruction": "a", "output": "b\\ud800", "annotated": "b\\ud800"}\n' > $R/surrogate.jsonl
printf '{"instruction": "a", "output": "b"}\n{"instruction": "a", "output": "b"}\n' > $R/dup.jsonl
printf '[{"instruction": "\xff"}]' > $R/ann_bad_utf8.json
printf 'not a folder\n' > $R/a_file
$P - "$R" <<'PY'
import json, sys
R = sys.argv[1]
records = [json.loads(line) for line in open("data/eval_sample.jsonl")]
def annotations(preferences, instructions=None):
    return [{"instruction": (instructions or {}).get(i, r["instruction"]), "output_1": r["output"],
             "output_2": "x" * (i + 1), "generator_1": "ref", "generator_2": "mine", "preference": p, "annotator": "a"}
            for i, (r, p) in enumerate(zip(records, preferences))]
def dump(name, rows):
    json.dump(rows, open(f"{R}/{name}", "w"))
dump("ann_ok.json", annotations([1.0, 2.0, 1.5]))
dump("ann_75.json", annotations([1.0, 7.5, 1.5]))
dump("ann_banana.json", annotations([1.0, "banana", 1.5]))
dump("ann_dup.json", annotations([1.0, 2.0, 1.5]) + annotations([1.0]))
dump("ann_unknown.json", annotations([1.0, 2.0, 1.5], {1: "Not in the eval set"}))
with open(f"{R}/long.jsonl", "w") as out:  # a million characters: far over any model's context
    for instruction in ("Name a fruit.", "word " * 200_000):
        out.write(json.dumps({"instruction": instruction, "output": "x"}) + "\n")
PY
pass=0; fail=0; n=0
check() {  # name expect(err|ok) cmd...
  local name=$1 expect=$2; shift 2; n=$((n+1))
  "$@" > $O/$n.out 2> $O/$n.err; local rc=$?
  local lines=$(grep -c "^error:" $O/$n.err); local tb=$(grep -c "Traceback" $O/$n.err $O/$n.out | awk -F: '{s+=$2} END {print s}')
  local key=$(grep -rl "SECRETKEY" $O 2>/dev/null | wc -l)
  local ok=0
  if [ $expect = err ] && [ $rc = 2 ] && [ $lines = 1 ] && [ $tb = 0 ] && [ $key = 0 ]; then ok=1; fi
  if [ $expect = ok ] && [ $rc = 0 ] && [ $tb = 0 ] && [ $key = 0 ]; then ok=1; fi
  if [ $ok = 1 ]; then pass=$((pass+1)); s=PASS; else fail=$((fail+1)); s=FAIL; fi
  echo "$s [$n] $name rc=$rc errlines=$lines tb=$tb key=$key :: $(grep '^error:' $O/$n.err | head -c 200)"
}
G="$P -m pasta.generate model=tiny max_new_tokens=4 paths.output_root=$O"
E="$P -m pasta.eval model=tiny paths.output_root=$O decode.max_new_tokens=4 eval.limit=2 judge=embedding eval.win_rate=false"
T="$P -m pasta.train stage=sft model=tiny paths.output_root=$O output_dir=$O/sft"
A="$P -m pasta.annotate model=tiny paths.output_root=$O progress=false"
# A server whose settings pass serves until stopped: `timeout` makes that a FAIL (rc 124), not a hang.
S="timeout 120 $P -m pasta.serve model=tiny paths.output_root=$O"
# settings
check "generate reservation policy bogus" err $G prompt=hi lang.reservation.policy=bogus
check "train reservation policy bogus" err $T lang.reservation.policy=bogus
check "eval reservation policy bogus" err $E lang.reservation.policy=bogus output_dir=$O/eval_bogus
[ -e $O/eval_bogus ] && echo "   ^ left $O/eval_bogus behind" && fail=$((fail+1))
check "train reservation multiple=0" err $T lang.reservation.multiple=0
check "generate reservation fixed=-1" err $G prompt=hi lang.reservation.fixed=-1
check "generate reservation scale=-2" err $G prompt=hi lang.reservation.scale=-2
check "generate model=bogus" err $G prompt=hi model=bogus
check "generate decode=bogus" err $G prompt=hi decode=bogus
check "eval decode=bogus" err $E decode=bogus
check "generate unknown key" err $G prompt=hi bogus=1
check "generate seed=abc" err $G prompt=hi seed=abc
check "generate max_new_tokens=0" err $G prompt=hi max_new_tokens=0
check "generate format=xml" err $G prompt=hi format=xml
check "annotate teacher.concurrency=0" err $A teacher=openai teacher.concurrency=0
check "eval judge.concurrency=0" err $E judge=openai judge.concurrency=0
check "eval eval.limit=-1" err $E eval.limit=-1
check "generate sampling.temperature=-1" err $G prompt=hi decode.sampling.temperature=-1
check "train stage.per_device_train_batch_size=0" err $T stage.per_device_train_batch_size=0
# Settings transformers, PEFT or torch refuse only after the model loads, or accept and train wrongly.
check "train stage.learning_rate=-1" err $T stage.learning_rate=-1
check "train stage.num_train_epochs=0" err $T stage.num_train_epochs=0
check "train stage.max_steps=0" err $T stage.max_steps=0
check "train stage.lr_scheduler_type=bogus" err $T stage.lr_scheduler_type=bogus
check "train stage.report_to=bogus" err $T stage.report_to=bogus
check "train stage.lora.r=0" err $T stage.lora.r=0
check "train stage=pref stage.temperature=-1" err $T stage=pref stage.temperature=-1
check "eval eval.bootstrap.num_resamples=-1" err $E eval.bootstrap.num_resamples=-1
check "eval judge=embedding with eval.win_rate=true" err $E eval.win_rate=true output_dir=$O/eval_embedding_win
[ -e $O/eval_embedding_win ] && echo "   ^ left $O/eval_embedding_win behind" && fail=$((fail+1))
check "eval bad override syntax" err $E 'eval.limit=[1'
check "serve port=abc" err $S port=abc
check "serve port=-5" err $S port=-5
check "serve port=70000" err $S port=70000
check "serve log_level=loud" err $S port=0 log_level=loud
check "serve limits.context_length over the model's 4096 positions" err $S port=0 limits.context_length=100000
# prompts are text
check "generate prompt with \${x}" ok $G 'prompt=What does ${x} mean?'
check "generate prompt with commas" ok $G 'prompt=Apples, pears, plums: which is best?'
# input files
check "lang check non-UTF-8" err $P -m pasta.lang check $R/bad_utf8.jsonl
check "lang check lone surrogate" err $P -m pasta.lang check $R/surrogate.jsonl
check "lang explain --file non-UTF-8" err $P -m pasta.lang explain --file $R/bad_utf8.json
check "lang explain --multiple 0" err $P -m pasta.lang explain "hello" --policy round_up --multiple 0
check "train sft non-UTF-8" err $T data.path=$R/bad_utf8.jsonl
check "train sft lone surrogate" err $T data.path=$R/surrogate.jsonl
check "train sft non-UTF-8 .json" err $T data.path=$R/bad_utf8.json
check "eval non-UTF-8 eval_data" err $E eval_data.path=$R/bad_utf8.jsonl
check "eval lone surrogate eval_data" err $E eval_data.path=$R/surrogate.jsonl
check "annotate non-UTF-8" err $A data.path=$R/bad_utf8.jsonl
check "annotate lone surrogate (rejected as invalid_unicode)" ok $A data.path=$R/surrogate.jsonl
check "annotate lone surrogate on_error=skip" ok $A data.path=$R/surrogate.jsonl data.on_error=skip output=$O/skip.jsonl
check "train sft data.path=<a folder> (a hub fallback data set)" err $T data=alpaca data.path=$R
check "eval eval_data.path=<a folder>" err $E eval_data.path=$R
# evaluation files
check "eval duplicate prompts refused before decoding" err $E eval_data.path=$R/dup.jsonl output_dir=$O/eval_dup
check "eval generate (for resume)" ok $E eval.mode=generate output_dir=$O/eval_run
check "eval resume with another reservation" err $E eval.mode=generate output_dir=$O/eval_run lang.reservation.scale=3
check "rescore valid annotations" ok $E eval.annotations=$R/ann_ok.json eval.win_rate=true output_dir=$O/rescore_ok eval.length_controlled=off
check "rescore preference 7.5" err $E eval.annotations=$R/ann_75.json eval.win_rate=true output_dir=$O/rescore1
check "rescore preference banana" err $E eval.annotations=$R/ann_banana.json eval.win_rate=true output_dir=$O/rescore2
check "rescore duplicated rows" err $E eval.annotations=$R/ann_dup.json eval.win_rate=true output_dir=$O/rescore3
check "rescore instruction not in eval set" err $E eval.annotations=$R/ann_unknown.json eval.win_rate=true output_dir=$O/rescore4
check "rescore non-UTF-8 annotations" err $E eval.annotations=$R/ann_bad_utf8.json eval.win_rate=true output_dir=$O/rescore5
# output paths: a file where a folder is wanted or the reverse, a file on the way, a read-only place, a device
check "generate paths.output_root=<a file>/out" err $P -m pasta.generate model=tiny max_new_tokens=4 prompt=hi paths.output_root=$R/a_file/out
check "eval output_dir=<a file>" err $E output_dir=$R/a_file
check "eval output_dir=<a file>/sub" err $E output_dir=$R/a_file/sub
check "train output_dir=<a file>" err $P -m pasta.train stage=sft model=tiny paths.output_root=$O data.path=$PWD/data/annotated_examples.jsonl output_dir=$R/a_file
check "annotate output=<a folder>" err $A output=$R
check "annotate output=<a file>/x.jsonl" err $A output=$R/a_file/x.jsonl
check "annotate output on a read-only place" err $A output=/sys/pasta-check-user-errors.jsonl
check "annotate output=/dev/full" err $A output=/dev/full
# output= a user's own data file whose last line has no newline: refused, and not one of its records lost
head -c -1 data/alpaca_sample.jsonl > $R/no_newline.jsonl
check "annotate output=<the data file, no final newline>" err $A data.path=$R/no_newline.jsonl output=$R/no_newline.jsonl
[ "$(grep -c . $R/no_newline.jsonl)" = "$(grep -c . data/alpaca_sample.jsonl)" ] || { echo "   ^ lost a record of $R/no_newline.jsonl"; fail=$((fail+1)); }
# a run whose file stops growing (ulimit -f, as a full disk stops it), then the same command resumes it
check "annotate output full mid-run" err bash -c "ulimit -f 16 && exec $A output=$O/full.jsonl"
check "annotate resumes after the full disk" ok $A output=$O/full.jsonl
# prompts over the model's context
check "eval prompt over the model's context" err $E eval_data.path=$R/long.jsonl output_dir=$O/eval_long
# keys: a server that echoes the Authorization header
start_server() {  # status [number of failed requests]
  rm -f $O/port.txt  # else the previous server's port may be read before this one writes its own
  $P tests/helpers/chat_server.py --port 0 --mode scripted --rules $R/rules.json --fail-first ${2:-100000} --fail-status $1 --echo-auth > $O/port.txt 2>/dev/null &
  SERVER=$!; for i in $(seq 50); do [ -s $O/port.txt ] && break; sleep 0.2; done; PORT=$(head -1 $O/port.txt)
}
echo '{}' > $R/rules.json
start_server 401
check "annotate teacher 401 echoing the key" err $A teacher=openai teacher.base_url=http://127.0.0.1:$PORT/v1 data.limit=3 output=$O/a401.jsonl
check "eval annotator 401 echoing the key" err env OPENAI_BASE_URL=http://127.0.0.1:$PORT/v1 $E eval.mode=score eval.win_rate=true output_dir=$O/eval_run eval.annotators_config=alpaca_eval_gpt4_turbo_fn
kill $SERVER; wait $SERVER 2>/dev/null
start_server 400
check "annotate teacher 400s echoing the key: every request failed" err $A teacher=openai teacher.base_url=http://127.0.0.1:$PORT/v1 data.limit=2 output=$O/a400.jsonl
check "eval judge=openai 400s echoing the key" err $E eval.mode=score eval.win_rate=true output_dir=$O/eval_run judge=openai judge.base_url=http://127.0.0.1:$PORT/v1
kill $SERVER; wait $SERVER 2>/dev/null
check "eval annotator endpoint down" err env OPENAI_BASE_URL=http://127.0.0.1:9/v1 $E eval.mode=score eval.win_rate=true output_dir=$O/eval_run eval.annotators_config=alpaca_eval_gpt4_turbo_fn
# a server that answers 200 with the key in its answer: the records written from it are redacted
echo '{"default": "Output (a)\nAuthorization: Bearer sk-test-SECRETKEY1234567890"}' > $R/rules.json
start_server 500 0
check "annotate teacher answering 200 with the key" ok $A teacher=openai teacher.base_url=http://127.0.0.1:$PORT/v1 data.limit=2 output=$O/a200.jsonl
check "eval annotator answering 200 with the key" ok env OPENAI_BASE_URL=http://127.0.0.1:$PORT/v1 $E eval.mode=score eval.win_rate=true output_dir=$O/eval_run eval.annotators_config=chatgpt eval.length_controlled=off
kill $SERVER; wait $SERVER 2>/dev/null
# damaged checkpoints and run files (issue 36): a weights file cut short, a torn round file, a bad record
$P - "$R" <<'PY'
import os, shutil, sys
from pasta.config import compose
from pasta.lang import add_tag_tokens
from pasta.models import load_model
R = sys.argv[1]
model, tokenizer = load_model(compose("generate", ["model=tiny"]).model)
add_tag_tokens(tokenizer, model)
model.save_pretrained(f"{R}/ckpt"); tokenizer.save_pretrained(f"{R}/ckpt")
for name, size in (("cut1000", 1000), ("cut0", 0), ("cuthalf", os.path.getsize(f"{R}/ckpt/model.safetensors") // 2)):
    shutil.copytree(f"{R}/ckpt", f"{R}/{name}")
    os.truncate(f"{R}/{name}/model.safetensors", size)
for name, file, text in (("config_list", "config.json", "[1, 2]"), ("tokenizer_empty", "tokenizer.json", "{}")):
    shutil.copytree(f"{R}/ckpt", f"{R}/{name}")  # JSON, but not what the file holds
    open(f"{R}/{name}/{file}", "w").write(text)
PY
printf '{"instruction": "a", "output": "b", "annotated": "<async topic=\\"x\\">b</async>"}\n' > $R/forking_bad.jsonl
check "generate model.safetensors cut to 1000 bytes" err $P -m pasta.generate model.path=$R/cut1000 prompt=hi max_new_tokens=4 paths.output_root=$O
check "generate model.safetensors cut to 0 bytes" err $P -m pasta.generate model.path=$R/cut0 prompt=hi max_new_tokens=4 paths.output_root=$O
check "eval model.safetensors cut in half" err $P -m pasta.eval model.path=$R/cuthalf paths.output_root=$O decode.max_new_tokens=4 eval.limit=2 judge=embedding eval.win_rate=false output_dir=$O/eval_cut
[ -e $O/eval_cut ] && echo "   ^ left $O/eval_cut behind" && fail=$((fail+1))
check "generate config.json a JSON list" err $P -m pasta.generate model.path=$R/config_list prompt=hi max_new_tokens=4 paths.output_root=$O
check "serve tokenizer.json an empty JSON object" err timeout 120 $P -m pasta.serve model.path=$R/tokenizer_empty paths.output_root=$O port=0
check "serve model.safetensors cut to 0 bytes" err timeout 120 $P -m pasta.serve model.path=$R/cut0 paths.output_root=$O port=0
mkdir -p $R/empty_model $R/run_folder && cp -r $R/ckpt $R/run_folder/final
check "generate model.path=<an empty folder>" err $P -m pasta.generate model.path=$R/empty_model prompt=hi max_new_tokens=4 paths.output_root=$O
check "generate model.path=<a run's folder, not its final/>" err $P -m pasta.generate model.path=$R/run_folder prompt=hi max_new_tokens=4 paths.output_root=$O
check "eval judge=hf judge.max_rating=10 (before decoding)" err $P -m pasta.eval model=tiny paths.output_root=$O decode.max_new_tokens=4 eval.limit=2 judge=hf judge.max_rating=10 output_dir=$O/eval_rating
[ -e $O/eval_rating ] && echo "   ^ left $O/eval_rating behind" && fail=$((fail+1))
check "annotate teacher=openai teacher.temperature=nan" err $A teacher=openai teacher.temperature=nan
check "train stage=pref stage.beta=0" err $P -m pasta.train stage=pref model=tiny paths.output_root=$O stage.beta=0
PREF="$P -m pasta.train stage=pref model.path=$R/ckpt model.dtype=float32 data.path=$PWD/data/annotated_examples.jsonl paths.output_root=$O stage.prompts_per_round=2 stage.num_samples=4 stage.max_new_tokens=8 stage.max_steps=1 stage.per_device_train_batch_size=1 judge=embedding"
check "pref stage.baseline_model=/nonexistent" err $PREF output_dir=$O/pref_base1 stage.reference=baseline stage.baseline_model=/nonexistent
check "pref stage.baseline_model cut to 1000 bytes" err $PREF output_dir=$O/pref_base2 stage.reference=baseline stage.baseline_model=$R/cut1000
check "pref one round (for resume)" ok $PREF output_dir=$O/pref stage.rounds=1
echo '{bad' > $O/pref/round-1/metrics.json
check "pref resume with round-1/metrics.json torn: redone" ok $PREF output_dir=$O/pref stage.rounds=1 resume=true
truncate -s 1000 $O/pref/round-1/final/model.safetensors
check "pref resume with round-1/final cut to 1000 bytes" err $PREF output_dir=$O/pref stage.rounds=2 resume=true
check "train sft data.extra_paths with malformed PASTA-LANG" err $T data.path=$PWD/data/annotated_examples.jsonl "data.extra_paths=[$R/forking_bad.jsonl]"
# the study's settings, before its first step
for setting in PASTA_STUDY_LAMBDAS=abc PASTA_STUDY_ROUNDS=0 PASTA_STUDY_ROUNDS=x PASTA_STUDY_EVAL_PROMPTS=99999 PASTA_STUDY_TIMED_PROMPTS=500; do
  check "cpu_study $setting" err env "$setting" PASTA_VENV="${PASTA_VENV:-.venv}" PASTA_STUDY_DIR=$O/study bash scripts/cpu_study.sh
done
[ -e $O/study ] && echo "   ^ left $O/study behind" && fail=$((fail+1))
# models complete
check "models complete README form + override" ok $P -m pasta.models complete --prompt "Name a fruit." model=tiny --max-new-tokens 4
check "models complete --max-new-tokens 0" err $P -m pasta.models complete model=tiny --max-new-tokens 0
check "models complete unknown model" err $P -m pasta.models complete model=bogus
# scripts
check "heldout_pool.py --out <a folder>" err $P scripts/heldout_pool.py --out $R
check "judge_validity.py --out <a folder> (before judging)" err $P scripts/judge_validity.py --out $R
check "study_plot.py on a folder of no runs" err $P scripts/study_plot.py $R $O/plot.png
# usage mistakes: argparse's usage block would be two lines, none of them `error:`
check "lang explain unknown flag" err $P -m pasta.lang explain "hello" --bogus
check "models complete --max-new-tokens x" err $P -m pasta.models complete model=tiny --max-new-tokens x
check "pair_signal.py without its scores file" err $P scripts/pair_signal.py
echo "passed $pass of $n ($fail failed)"
[ $fail = 0 ]
