#!/usr/bin/env bash
# `tessera train --checkpoint-dir`: --keep removes only this run's checkpoints (and its ancestors'), never the
# file it has just written, never a file it cannot verify (damaged, a FIFO, a link, another run's or branch's);
# a restart resumes the newest checkpoint of the run that saved last, not the highest-numbered name.
set -u
TS=${1:?usage: cli_ckdir.sh path/to/tessera}
. "$(dirname "$0")/testlib.sh"
need_fashion_mnist
test_tmpdir
has()  { grep -qF -- "$2" "$1" && ok "$3" || bad "$3: $(cat "$1")"; }
step() { printf '%s/step-%012d.ckpt' "$1" "$2"; }

base=(--model mlp --batch-size 32 --seed 5 --quiet --checkpoint-every 5)

# ---- a damaged file, a FIFO and a link with higher step numbers: the new saves stay -----------------------
D=$T/d
"$TS" train "${base[@]}" --max-steps 10 --checkpoint-dir "$D" > "$T/a.log" 2>&1 || bad "first run: $(cat "$T/a.log")"
head -c 1000 "$(step "$D" 10)" > "$(step "$D" 999)"
mkfifo "$(step "$D" 998)"
ln -s "$(basename "$(step "$D" 5)")" "$(step "$D" 997)"
timeout 120 "$TS" train "${base[@]}" --max-steps 20 --checkpoint-dir "$D" --keep 1 > "$T/b.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "train --keep 1 beside foreign files" || bad "train --keep 1: rc $rc: $(cat "$T/b.log")"
has "$T/b.log" "resumed from $(step "$D" 10)" "the restart resumed the newest valid checkpoint, step 10"
has "$T/b.log" "skipping checkpoint $(step "$D" 999): truncated" "the damaged file is named"
has "$T/b.log" "skipping $(step "$D" 998): it is a FIFO" "the FIFO is named"
has "$T/b.log" "skipping $(step "$D" 997): it is a symbolic link" "the link is named"
[ -f "$(step "$D" 20)" ] && "$TS" ckpt show "$(step "$D" 20)" > /dev/null 2>&1 && ok "step 20 was kept and loads" \
  || bad "step 20 is gone or damaged: $(ls -l "$D")"
for s in 5 10 15; do [ ! -e "$(step "$D" $s)" ] || bad "step $s should have been pruned: $(ls "$D")"; done
[ "$(stat -c %s "$(step "$D" 999)")" = 1000 ] && [ -p "$(step "$D" 998)" ] && [ -L "$(step "$D" 997)" ] &&
  ok "the damaged file, the FIFO and the link are left alone" || bad "foreign files touched: $(ls -l "$D")"
has "$T/b.log" "holds 3 files named like checkpoints that are not of this run's lineage" "one warning counts them"

# ---- a branch: resuming step 10 of a run that went on to step 40 ------------------------------------------
B=$T/branch
"$TS" train "${base[@]}" --max-steps 40 --checkpoint-dir "$B" > "$T/c.log" 2>&1 || bad "run to 40: $(cat "$T/c.log")"
"$TS" train "${base[@]}" --max-steps 25 --checkpoint-dir "$B" --keep 2 --resume "$(step "$B" 10)" > "$T/d.log" 2>&1 \
  || bad "branch from step 10: $(cat "$T/d.log")"
[ -f "$(step "$B" 20)" ] && [ -f "$(step "$B" 25)" ] && ok "the branch's newest two files are kept" || bad "branch files: $(ls "$B")"
for s in 5 10; do [ ! -e "$(step "$B" $s)" ] || bad "ancestor step $s should have been pruned by --keep 2: $(ls "$B")"; done
for s in 30 35 40; do [ -f "$(step "$B" $s)" ] || bad "the other branch's step $s was removed: $(ls "$B")"; done
[ -f "$(step "$B" 15).other-1" ] && [ -f "$(step "$B" 20).other-1" ] && ok "the other branch's steps 15 and 20 were moved aside" \
  || bad "other branch's files at the same steps: $(ls "$B")"
has "$T/d.log" "moved to $(step "$B" 15).other-1" "moving aside is announced"
"$TS" train "${base[@]}" --max-steps 30 --checkpoint-dir "$B" --keep 2 > "$T/e.log" 2>&1 || bad "restart: $(cat "$T/e.log")"
has "$T/e.log" "resumed from $(step "$B" 25)" "a restart resumes the branch that saved last, not step 40"
has "$T/e.log" "holds 3 checkpoints of another run or branch" "the restart warns about the other branch"
[ -f "$(step "$B" 40)" ] && [ -f "$(step "$B" 30)" ] && ok "the other branch is still there" || bad "after restart: $(ls "$B")"

cli_summary
