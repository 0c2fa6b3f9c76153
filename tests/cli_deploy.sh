#!/usr/bin/env bash
# tests/cli_deploy.sh — the deployment files in deploy/ parse, and the launch environment each one
# gives the ranks is what tessera train's launcher detection (src/distributed/env.c) needs: each is
# simulated on this machine with two real ranks, which must form ONE 2-rank job (one banner, rank 0
# alone writes checkpoints, no job-token warning) and resume from the checkpoint folder:
#   1. deploy/slurm/train.sbatch: bash -n, #SBATCH lines, no RANK/WORLD_SIZE set by hand; then the
#      script itself runs with the environment sbatch gives it and a fake `srun` on PATH that starts
#      2 tasks here with the SLURM_* variables srun sets (SLURM_PROCID, SLURM_STEP_ID, ...); a failed
#      job step is retried and resumes from the checkpoint folder; a usage error is not retried.
#   2. deploy/k8s/indexed-job.yaml: Service + Indexed Job (completions = parallelism = WORLD_SIZE,
#      RANK from the completion index, MASTER_ADDR = pod 0 through the headless Service, TS_JOB_TOKEN
#      from a Secret, /dev/shm a memory emptyDir); then the container's env (RANK = index 0 and 1,
#      MASTER_ADDR -> 127.0.0.1, MASTER_PORT -> a free port) and args run as two ranks.
#   3. deploy/k8s/pytorchjob.yaml: Master + Worker, container "pytorch" with port "pytorchjob-port",
#      no RANK/WORLD_SIZE/MASTER_* of its own; then the operator's variables (RANK 0 and 1,
#      WORLD_SIZE = replicas, MASTER_ADDR, MASTER_PORT) with the template's env and args.
#   4. deploy/Dockerfile: a lint (known instructions, stages, ENTRYPOINT tessera, install-deps and
#      make install) and that its runtime packages provide the libraries this tessera links (dpkg).
# YAML is read with Python's yaml module where one is found (tests/find_python.sh); without it
# (or with TS_DEPLOY_NO_YAML=1) a line-based check of the same fields runs instead. Nothing needs
# docker, kubectl or Slurm.
set -u
TS=${1:?usage: cli_deploy.sh path/to/tessera}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEP=$ROOT/deploy
DATA=/usr/share/datasets/fashion-mnist
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "skip: no $DATA"; exit 77; }
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TS_LAUNCHED_BY TS_JOB_TOKEN
for v in $(env | grep -o -E '^(SLURM_|OMPI_COMM_|PMI_|PMIX_|TORCHELASTIC_)[A-Z_]*'); do unset "$v"; done
. "$(dirname "$0")/testlib.sh"
test_tmpdir
count() { grep -c -- "$1" "$2" 2>/dev/null || true; }
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { local p; while :; do p=$((20000 + RANDOM % 10000)); port_free $p && { echo $p; return; }; done; }
new_token() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
# a short run of the mlp, appended to each file's own tessera train flags (the last of a flag wins)
short=(--model mlp --epochs 1 --batch-size 32 --seed 3 --quiet --timeout 60 --checkpoint-every 3)

for f in slurm/train.sbatch k8s/indexed-job.yaml k8s/pytorchjob.yaml Dockerfile; do
  [ -f "$DEP/$f" ] && ok "deploy/$f exists" || bad "deploy/$f is missing"
done

# --checkpoint-dir's file for optimizer step N
ckname() { printf '%s/step-%012d.ckpt' "$1" "$2"; }
# one_job NAME LOG CKPT_DIR STEP: the two ranks' output (LOG) is one 2-rank job that saved DIR's step-STEP file
one_job() {
  local ck; ck=$(ckname "$3" "$4")
  [ "$(count "training mlp.* 2 ranks (DDP)" "$2")" = 1 ] && ok "$1: one 2-rank job" || bad "$1: not one 2-rank job: $(cat "$2")"
  [ "$(count "saved checkpoint to $ck" "$2")" -ge 1 ] && [ -f "$ck" ] \
    && ok "$1: rank 0 saved $(basename "$3")/$(basename "$ck")" || bad "$1: no $ck: $(cat "$2")"
  [ "$(count "^done:" "$2")" = 1 ] && ok "$1: rank 0 alone reports" || bad "$1: $(count "^done:" "$2") done lines"
  [ "$(count "no job token" "$2")" = 0 ] && ok "$1: authenticated (TS_JOB_TOKEN reached every rank)" \
    || bad "$1: a rank ran without a job token: $(grep "no job token" "$2" | head -2)"
}

# ================================================================================================
# 1. Slurm
S=$DEP/slurm/train.sbatch
if [ -f "$S" ]; then
  bash -n "$S" && ok "train.sbatch: bash -n" || bad "train.sbatch: bash -n fails"
  grep -qE '^#SBATCH +--nodes[= ]2\b' "$S" && ok "train.sbatch: #SBATCH --nodes=2" || bad "train.sbatch: no #SBATCH --nodes=2"
  grep -qE '^#SBATCH +--ntasks-per-node[= ][0-9]+' "$S" && ok "train.sbatch: #SBATCH --ntasks-per-node" \
    || bad "train.sbatch: no #SBATCH --ntasks-per-node"
  code=$(sed -e 's/#.*//' "$S")   # without comments (and #SBATCH lines)
  if grep -qE '(^|[^A-Z_])(export +)?(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|SLURM_PROCID)=' <<<"$code"; then
    bad "train.sbatch sets a rank variable by hand: $(grep -E '(RANK|WORLD_SIZE|SLURM_PROCID)=' <<<"$code")"
  else
    ok "train.sbatch sets no RANK/WORLD_SIZE/LOCAL_RANK by hand"
  fi
  grep -qE '^\s*srun\b.*\btrain\b' <<<"$code" && ok "train.sbatch: srun ... tessera train" || bad "train.sbatch: no srun ... train line"
  grep -q -- '--checkpoint-dir' <<<"$code" && ok "train.sbatch: --checkpoint-dir" || bad "train.sbatch: no --checkpoint-dir"
  grep -qE 'export +TS_JOB_TOKEN' <<<"$code" && ok "train.sbatch exports TS_JOB_TOKEN" || bad "train.sbatch: TS_JOB_TOKEN not exported"

  # The script itself, under the environment sbatch gives a batch script (one node here, 2 tasks),
  # with stale rank variables from the "submitting shell" it must not pass on. The fake srun starts
  # each task with what srun sets for a task of a job step.
  mkdir -p "$T/bin" "$T/submit"
  cat > "$T/bin/srun" <<'FAKE'
#!/usr/bin/env bash
# fake srun: 2 tasks of a new job step on this host
n=$(cat "$FAKE_SRUN_DIR/calls" 2>/dev/null || echo 0); echo $((n + 1)) > "$FAKE_SRUN_DIR/calls"
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do echo "$1" >> "$FAKE_SRUN_DIR/opts"; shift; done
env > "$FAKE_SRUN_DIR/env.$n"
[ "${FAKE_SRUN_FAIL_FIRST:-0}" = 1 ] && [ "$n" = 0 ] && { echo "srun: error: task 1: Killed" >&2; exit 137; }
for r in 0 1; do
  env SLURM_STEP_ID=$n SLURM_STEPID=$n SLURM_PROCID=$r SLURM_LOCALID=$r SLURM_NODEID=0 SLURM_STEP_NUM_TASKS=2 \
      SLURM_NTASKS=2 SLURM_NPROCS=2 SLURM_STEP_TASKS_PER_NODE=2 SLURM_TASKS_PER_NODE=2 SLURM_STEP_NUM_NODES=1 \
      SLURM_STEP_NODELIST=localhost SLURM_NODELIST=localhost SLURM_JOB_NODELIST=localhost "$@" &
  pids[$r]=$!
done
rc=0
for r in 0 1; do wait ${pids[$r]} || { s=$?; [ $s -gt $rc ] && rc=$s; }; done
exit $rc
FAKE
  chmod +x "$T/bin/srun"
  jobid=$(( (RANDOM << 8 | RANDOM) % 900000 + 100000 ))
  while ! port_free $((10000 + jobid % 20000)); do jobid=$((jobid + 1)); done
  sbatch_env=(SLURM_JOB_ID="$jobid" SLURM_JOBID="$jobid" SLURM_JOB_NAME=tessera-train SLURM_JOB_NODELIST=localhost
              SLURM_NODELIST=localhost SLURM_NNODES=1 SLURM_JOB_NUM_NODES=1 SLURM_NTASKS=2 SLURM_NPROCS=2
              SLURM_TASKS_PER_NODE=2 SLURM_NTASKS_PER_NODE=2 SLURM_CPUS_PER_TASK=1 SLURM_PROCID=0 SLURM_NODEID=0
              SLURM_LOCALID=0 SLURM_SUBMIT_DIR="$T/submit" RANK=5 WORLD_SIZE=7
              PATH="$T/bin:$PATH" TESSERA="$TS" RESTART_DELAY=0)
  sbatch_run() { # LOG ENV... -- ARGS...: runs the script as sbatch would, in the submit dir
    local log=$1; shift; local e=(); while [ "$1" != -- ]; do e+=("$1"); shift; done; shift
    rm -rf "$T/srun"; mkdir -p "$T/srun"
    (cd "$T/submit" && env "${sbatch_env[@]}" FAKE_SRUN_DIR="$T/srun" "${e[@]}" timeout 300 bash "$S" "$@") > "$log" 2>&1
  }
  CK=$T/submit/checkpoints/tessera-train
  sbatch_run "$T/slurm1.log" -- "${short[@]}" --max-steps 6; rc=$?
  [ $rc -eq 0 ] && ok "train.sbatch under a fake srun: exit 0" || bad "train.sbatch (exit $rc): $(cat "$T/slurm1.log")"
  one_job "slurm" "$T/slurm1.log" "$CK" 6
  tok=$(sed -n 's/^TS_JOB_TOKEN=//p' "$T/srun/env.0" 2>/dev/null)
  [[ "$tok" =~ ^[0-9a-f]{64}$ ]] && ok "slurm: srun got a 64-hex-digit TS_JOB_TOKEN" || bad "slurm: token for srun '$tok'"
  grep -qE '^(RANK|WORLD_SIZE)=' "$T/srun/env.0" 2>/dev/null && bad "slurm: stale RANK/WORLD_SIZE reached srun" \
    || ok "slurm: stale RANK/WORLD_SIZE of the submitting shell removed"
  grep -qx -- '--kill-on-bad-exit=1' "$T/srun/opts" 2>/dev/null && ok "slurm: srun --kill-on-bad-exit=1" \
    || bad "slurm: srun options: $(cat "$T/srun/opts" 2>/dev/null)"
  grep -qx -- '--cpus-per-task=1' "$T/srun/opts" 2>/dev/null && ok "slurm: srun --cpus-per-task from the allocation" \
    || bad "slurm: no --cpus-per-task for srun: $(cat "$T/srun/opts" 2>/dev/null)"
  # a failed job step: the script starts another, which resumes from the checkpoint folder
  sbatch_run "$T/slurm2.log" FAKE_SRUN_FAIL_FIRST=1 -- "${short[@]}" --max-steps 9; rc=$?
  [ $rc -eq 0 ] && [ "$(cat "$T/srun/calls")" = 2 ] && grep -q "restart 1 of" "$T/slurm2.log" \
    && ok "slurm: a failed job step is restarted" || bad "slurm restart (exit $rc): $(cat "$T/slurm2.log")"
  grep -qF "resumed from $(ckname "$CK" 6)" "$T/slurm2.log" && ok "slurm: the restart resumes from step-6.ckpt" \
    || bad "slurm: no resume from step-6: $(cat "$T/slurm2.log")"
  one_job "slurm restart" "$T/slurm2.log" "$CK" 9
  # a usage error (exit 2) is not retried
  sbatch_run "$T/slurm3.log" -- "${short[@]}" --model no-such-model; rc=$?
  [ $rc -eq 2 ] && [ "$(cat "$T/srun/calls")" = 1 ] && ok "slurm: a usage error stops the job (exit 2, no retry)" \
    || bad "slurm usage error (exit $rc, $(cat "$T/srun/calls") job steps): $(cat "$T/slurm3.log")"
fi

# ================================================================================================
# 2./3. Kubernetes. The checker writes, per manifest, what the simulation needs:
#   <out>.env   NAME<TAB>VALUE, VALUE a literal or @field:PATH, @secret:NAME/KEY, @resource:RES
#   <out>.args  the container's args, one per line;  <out>.mounts  MOUNTPATH<TAB>VOLUME-KIND
#   <out>.info  KEY<TAB>VALUE (world size, port, ...)
# and prints ok:/FAIL: lines.
PY=""
[ "${TS_DEPLOY_NO_YAML:-0}" = 1 ] || PY=$(bash "$ROOT/tests/find_python.sh" yaml 2>/dev/null)
k8s_check_yaml() { # FILE OUT KIND(indexed|pytorchjob)
  "$PY" - "$@" <<'PYEOF'
import sys, yaml
path, out, kind = sys.argv[1:4]
res = []
def ok(m): res.append("ok: " + m)
def bad(m): res.append("FAIL: " + m)
def check(c, m): ok(m) if c else bad(m)
try:
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
except Exception as e:
    print("FAIL: %s does not parse: %s" % (path, e)); sys.exit(0)
ok("%s parses (%d documents)" % (path.split("/")[-1], len(docs)))
by = {}
for d in docs: by.setdefault(d.get("kind"), []).append(d)
info, env, args, mounts = {}, [], [], []
def envlist(c):
    r = []
    for e in c.get("env") or []:
        v = e.get("value")
        vf = e.get("valueFrom") or {}
        if "fieldRef" in vf: v = "@field:" + vf["fieldRef"]["fieldPath"]
        elif "secretKeyRef" in vf: v = "@secret:%s/%s" % (vf["secretKeyRef"]["name"], vf["secretKeyRef"]["key"])
        elif "resourceFieldRef" in vf: v = "@resource:" + vf["resourceFieldRef"]["resource"]
        r.append((e["name"], "" if v is None else str(v)))
    return r
def pod_common(spec, c, what):
    global args, mounts
    args = [str(a) for a in (c.get("args") or [])]
    check(not c.get("command"), what + ": no command: the image's ENTRYPOINT (tessera) runs with args")
    check(args[:1] == ["train"], what + ": args start with train")
    check("--checkpoint-dir" in args, what + ": --checkpoint-dir")
    vols = {v["name"]: v for v in spec.get("volumes") or []}
    for m in c.get("volumeMounts") or []:
        v = vols.get(m["name"], {})
        k = "pvc" if "persistentVolumeClaim" in v else "memory" if (v.get("emptyDir") or {}).get("medium") == "Memory" else "other"
        mounts.append((m["mountPath"], k))
    check(("/dev/shm", "memory") in mounts, what + ": /dev/shm is an emptyDir with medium Memory")
    if "--checkpoint-dir" in args:
        d = args[args.index("--checkpoint-dir") + 1]
        check((d, "pvc") in mounts, what + ": --checkpoint-dir %s is a mounted PersistentVolumeClaim" % d)
    r = c.get("resources") or {}
    check(bool(r.get("requests")) and bool(r.get("limits")), what + ": resources requests and limits")
    e = dict(envlist(c))
    check(e.get("TS_JOB_TOKEN", "").startswith("@secret:"), what + ": TS_JOB_TOKEN from a Secret")
if kind == "indexed":
    jobs, svcs = by.get("Job", []), by.get("Service", [])
    check(len(jobs) == 1 and len(svcs) == 1, "one Job and one Service")
    if jobs and svcs:
        job, svc = jobs[0], svcs[0]
        js, name, sname = job["spec"], job["metadata"]["name"], svc["metadata"]["name"]
        check(js.get("completionMode") == "Indexed", "completionMode: Indexed")
        world = js.get("completions")
        check(isinstance(world, int) and world == js.get("parallelism"), "completions = parallelism (%s)" % world)
        check(svc["spec"].get("clusterIP") == "None", "the Service is headless (clusterIP: None)")
        check(svc["spec"].get("selector", {}).get("job-name") == name, "the Service selects the Job's pods (job-name: %s)" % name)
        spec = js["template"]["spec"]
        check(spec.get("subdomain") == sname, "the pod template's subdomain is the Service (%s)" % sname)
        c = spec["containers"][0]
        env = envlist(c)
        e = dict(env)
        check(e.get("RANK") == "@field:metadata.annotations['batch.kubernetes.io/job-completion-index']",
              "RANK from the completion index annotation")
        check(e.get("WORLD_SIZE") == str(world), "WORLD_SIZE = completions (%s)" % e.get("WORLD_SIZE"))
        ma = e.get("MASTER_ADDR", "")
        check(ma.startswith("%s-0.%s" % (name, sname)) and all(p in ("", ".$(POD_NAMESPACE).svc.cluster.local")
              for p in [ma[len("%s-0.%s" % (name, sname)):]]), "MASTER_ADDR is pod 0 through the Service (%s)" % ma)
        check(e.get("MASTER_PORT", "").isdigit(), "MASTER_PORT is a port number (%s)" % e.get("MASTER_PORT"))
        if "$(POD_NAMESPACE)" in ma:
            check(e.get("POD_NAMESPACE") == "@field:metadata.namespace", "POD_NAMESPACE from metadata.namespace")
            names = [n for n, _ in env]
            check("POD_NAMESPACE" in names and names.index("POD_NAMESPACE") < names.index("MASTER_ADDR"),
                  "POD_NAMESPACE is defined before MASTER_ADDR uses it")
        check(spec.get("restartPolicy") in ("Never", "OnFailure"), "restartPolicy Never or OnFailure")
        pod_common(spec, c, "Job")
        info = {"world": world}
elif kind == "pytorchjob":
    jobs = by.get("PyTorchJob", [])
    check(len(jobs) == 1 and jobs[0].get("apiVersion") == "kubeflow.org/v1", "one kubeflow.org/v1 PyTorchJob")
    if jobs:
        js = jobs[0]["spec"]
        rs = js.get("pytorchReplicaSpecs", {})
        check(set(rs) == {"Master", "Worker"}, "Master and Worker replica specs")
        check(rs.get("Master", {}).get("replicas") == 1, "one Master")
        check("elasticPolicy" not in js, "no elasticPolicy (it expects torchrun in the container)")
        check(str(js.get("nprocPerNode", "1")) == "1", "no nprocPerNode (WORLD_SIZE = replicas, one rank per pod)")
        world = sum(int(r.get("replicas", 1)) for r in rs.values())
        port = None
        for rt in ("Master", "Worker"):
            if rt not in rs: continue
            spec = rs[rt]["template"]["spec"]
            cs = [c for c in spec["containers"] if c.get("name") == "pytorch"]
            check(len(cs) == 1, rt + ": a container named pytorch (the operator sets its variables there)")
            if not cs: continue
            c = cs[0]
            e = envlist(c)
            own = [n for n, _ in e if n in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")]
            check(not own, rt + ": sets none of the operator's RANK/WORLD_SIZE/MASTER_* itself %s" % (own or ""))
            ports = [p for p in c.get("ports") or [] if p.get("name") == "pytorchjob-port"]
            if rt == "Master":
                check(len(ports) == 1, "Master: a port named pytorchjob-port (the operator's MASTER_PORT)")
                if ports: port = ports[0]["containerPort"]
            pod_common(spec, c, rt)
            if rt == "Master": env = e
        info = {"world": world, "port": port, "master_addr": jobs[0]["metadata"]["name"] + "-master-0"}
with open(out + ".env", "w") as f:
    for n, v in env: f.write("%s\t%s\n" % (n, v))
with open(out + ".args", "w") as f:
    for a in args: f.write(a + "\n")
with open(out + ".mounts", "w") as f:
    for m, k in mounts: f.write("%s\t%s\n" % (m, k))
with open(out + ".info", "w") as f:
    for k, v in info.items(): f.write("%s\t%s\n" % (k, v))
print("\n".join(res))
PYEOF
}
# The same fields line by line, for a machine without Python's yaml: env names with their value or
# source, the args list, mounts; fails on what it cannot find.
k8s_check_lines() { # FILE OUT KIND
  local f=$1 out=$2 kind=$3
  awk '
    function indent(s) { match(s, /^ */); return RLENGTH }
    { sub(/[ \t]+#.*$/, ""); if ($0 ~ /^[ \t]*#/ || $0 ~ /^[ \t]*$/) next }
    /^---/ { inargs = 0; inenv = 0; next }
    # args: "- item" lines below "args:"
    inargs && indent($0) >= ai && $0 ~ /^ *- / { a = $0; sub(/^ *- */, "", a); gsub(/^"|"$/, "", a); print "ARG\t" a; next }
    inargs { inargs = 0 }
    /^ *args: *$/ { inargs = 1; ai = indent($0); next }
    # env: "- name: X" then "value: V" or a valueFrom
    /^ *env: *$/ { inenv = 1; ei = indent($0); next }
    inenv && indent($0) <= ei { inenv = 0 }
    inenv && /^ *- name: / { if (n != "") print "ENV\t" n "\t" v; n = $0; sub(/^ *- name: */, "", n); v = ""; next }
    inenv && /^ *value: / { v = $0; sub(/^ *value: */, "", v); gsub(/^"|"$/, "", v); next }
    inenv && /fieldPath: / { v = $0; sub(/^ *fieldPath: */, "", v); v = "@field:" v; next }
    inenv && /secretKeyRef:/ { v = "@secret:"; next }
    inenv && /resource: / { v = $0; sub(/^ *resource: */, "", v); v = "@resource:" v; next }
    inenv && /^ *name: / && v == "@secret:" { s = $0; sub(/^ *name: */, "", s); v = v s; next }
    inenv && /^ *key: / && v ~ /^@secret:/ { k = $0; sub(/^ *key: */, "", k); v = v "/" k; next }
    /mountPath: \/dev\/shm/ { print "MOUNT\t/dev/shm" }
    /^ *(completions|parallelism|completionMode|subdomain|clusterIP|replicas|restartPolicy|nprocPerNode|elasticPolicy|containerPort|job-name):/ {
      k = $0; sub(/^ *(- )?/, "", k); val = k; sub(/:.*/, "", k); sub(/^[^:]*: */, "", val); gsub(/^"|"$/, "", val); print "KEY\t" k "\t" val }
    /^ *- name: pytorch *$/ { print "KEY\tcontainer\tpytorch" }
    /^ *- name: pytorchjob-port *$/ { print "KEY\tportname\tpytorchjob-port" }
    /medium: Memory/ { print "KEY\tmedium\tMemory" }
    END { if (n != "") print "ENV\t" n "\t" v }
  ' "$f" > "$out.lines"
  awk -F'\t' '$1 == "ENV" { print $2 "\t" $3 }' "$out.lines" | awk '!seen[$1]++' > "$out.env"
  awk -F'\t' '$1 == "ARG" { print $2 }' "$out.lines" | awk 'NR == 1 || $0 != "train" || !t++' > "$out.args"
  key() { awk -F'\t' -v k="$1" '$1 == "KEY" && $2 == k { print $3; exit }' "$out.lines"; }
  envv() { awk -F'\t' -v k="$1" '$1 == k { print $2; exit }' "$out.env"; }
  local base; base=$(basename "$f")
  echo "ok: $base read line by line (no Python yaml module)"
  grep -qx -- '--checkpoint-dir' "$out.args" && echo "ok: $base: --checkpoint-dir" || echo "FAIL: $base: no --checkpoint-dir in args"
  [ "$(head -1 "$out.args")" = train ] && echo "ok: $base: args start with train" || echo "FAIL: $base: args: $(tr '\n' ' ' < "$out.args")"
  [ "$(key medium)" = Memory ] && grep -q "^MOUNT" "$out.lines" && echo "ok: $base: /dev/shm on a Memory emptyDir" \
    || echo "FAIL: $base: /dev/shm is not a Memory emptyDir"
  [[ "$(envv TS_JOB_TOKEN)" == @secret:* ]] && echo "ok: $base: TS_JOB_TOKEN from a Secret" || echo "FAIL: $base: TS_JOB_TOKEN '$(envv TS_JOB_TOKEN)'"
  : > "$out.info"
  if [ "$kind" = indexed ]; then
    local w; w=$(key completions)
    [ "$(key completionMode)" = Indexed ] && echo "ok: completionMode: Indexed" || echo "FAIL: completionMode '$(key completionMode)'"
    [ -n "$w" ] && [ "$w" = "$(key parallelism)" ] && [ "$w" = "$(envv WORLD_SIZE)" ] \
      && echo "ok: completions = parallelism = WORLD_SIZE ($w)" || echo "FAIL: completions $w, parallelism $(key parallelism), WORLD_SIZE $(envv WORLD_SIZE)"
    [ "$(key clusterIP)" = None ] && echo "ok: headless Service" || echo "FAIL: Service clusterIP '$(key clusterIP)'"
    [ "$(envv RANK)" = "@field:metadata.annotations['batch.kubernetes.io/job-completion-index']" ] \
      && echo "ok: RANK from the completion index" || echo "FAIL: RANK '$(envv RANK)'"
    [[ "$(envv MASTER_ADDR)" == "$(key job-name)-0.$(key subdomain)"* ]] && echo "ok: MASTER_ADDR is pod 0 through the Service" \
      || echo "FAIL: MASTER_ADDR '$(envv MASTER_ADDR)' (job-name $(key job-name), subdomain $(key subdomain))"
    [[ "$(envv MASTER_PORT)" =~ ^[0-9]+$ ]] && echo "ok: MASTER_PORT" || echo "FAIL: MASTER_PORT '$(envv MASTER_PORT)'"
    printf 'world\t%s\n' "$w" > "$out.info"
  else
    [ "$(key container)" = pytorch ] && echo "ok: a container named pytorch" || echo "FAIL: no container named pytorch"
    [ "$(key portname)" = pytorchjob-port ] && echo "ok: a port named pytorchjob-port" || echo "FAIL: no pytorchjob-port"
    [ -z "$(key nprocPerNode)$(key elasticPolicy)" ] && echo "ok: no nprocPerNode/elasticPolicy" || echo "FAIL: nprocPerNode/elasticPolicy set"
    local own; own=$(awk -F'\t' '$1 ~ /^(RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT)$/ { print $1 }' "$out.env" | tr '\n' ' ')
    [ -z "$own" ] && echo "ok: sets none of the operator's RANK/WORLD_SIZE/MASTER_*" || echo "FAIL: sets $own"
    local w; w=$(awk -F'\t' '$1 == "KEY" && $2 == "replicas" { s += $3 } END { print s + 0 }' "$out.lines")
    printf 'world\t%s\nport\t%s\n' "$w" "$(key containerPort)" > "$out.info"
  fi
}
k8s_check() { # FILE OUT KIND: prints ok:/FAIL: lines and counts them
  local lines
  if [ -n "$PY" ]; then lines=$(k8s_check_yaml "$@" 2>&1); else lines=$(k8s_check_lines "$@" 2>&1); fi
  while IFS= read -r l; do
    case $l in ok:*) ok "${l#ok: }" ;; FAIL:*) bad "${l#FAIL: }" ;; *) [ -n "$l" ] && bad "checker: $l" ;; esac
  done <<<"$lines"
}
[ -n "$PY" ] && echo "note: YAML read with $PY" || echo "note: no Python yaml module (or TS_DEPLOY_NO_YAML=1): line-based checks"

# k8s_rank OUT RANK PORT TOKEN CKPT LOG [NAME=VALUE...] -- [FLAGS...]: one rank with the container's env
# (the kubelet's work: fieldRefs, the Secret, $(VAR) expansion) plus the operator's NAME=VALUEs, MASTER_ADDR
# as 127.0.0.1 (DNS is not there) and MASTER_PORT as a free port, running the container's args.
k8s_rank() {
  local out=$1 rank=$2 port=$3 token=$4 ckpt=$5 log=$6; shift 6
  declare -A E=()
  local names=() n v
  while IFS=$'\t' read -r n v; do
    case $v in
      "@field:metadata.annotations['batch.kubernetes.io/job-completion-index']") v=$rank ;;
      @field:metadata.namespace) v=default ;;
      @field:*) v=x ;;
      @secret:*) v=$token ;;
      @resource:*) v=1 ;;
    esac
    E[$n]=$v; names+=("$n")
  done < "$out.env"
  while [ $# -gt 0 ] && [ "$1" != -- ]; do E[${1%%=*}]=${1#*=}; names+=("${1%%=*}"); shift; done
  shift
  E[MASTER_ADDR]=127.0.0.1; E[MASTER_PORT]=$port; names+=(MASTER_ADDR MASTER_PORT)
  expand() { local s=$1 k; for k in "${!E[@]}"; do s=${s//"\$($k)"/${E[$k]}}; done; printf '%s' "$s"; }
  local envs=() a args=()
  for n in $(printf '%s\n' "${names[@]}" | awk '!seen[$0]++'); do envs+=("$n=$(expand "${E[$n]}")"); done
  local ckmount; ckmount=$(awk -F'\t' '$2 == "pvc" { print $1; exit }' "$out.mounts" 2>/dev/null)
  local prev=""
  while IFS= read -r a; do
    a=$(expand "$a")
    # the checkpoint volume's mount path (or, line-based, whatever follows --checkpoint-dir) -> CKPT
    if [ "$prev" = --checkpoint-dir ] && { [ -z "$ckmount" ] || [ "$a" = "$ckmount" ]; }; then a=$ckpt; fi
    args+=("$a"); prev=$a
  done < "$out.args"
  [ "${args[0]:-}" = train ] || { echo "args do not start with train: ${args[*]}" > "$log"; return 2; }
  env "${envs[@]}" timeout 300 "$TS" "${args[@]}" "$@" > "$log" 2>&1
}
# k8s_job NAME OUT [NAME=VALUE per rank: "0:RANK=0" ...] -- FLAGS: two ranks, then their joint log in $T/NAME.log
k8s_job() {
  local name=$1 out=$2; shift 2
  local per=() ; while [ "$1" != -- ]; do per+=("$1"); shift; done; shift
  local port token r extra pids=() rcs=()
  port=$(free_port); token=$(new_token)
  for r in 0 1; do
    extra=(); for x in "${per[@]}"; do [ "${x%%:*}" = $r ] && extra+=("${x#*:}"); done
    k8s_rank "$out" $r $port $token "$T/$name-ckpt" "$T/$name.$r.log" "${extra[@]}" -- "$@" &
    pids[$r]=$!
  done
  for r in 0 1; do wait ${pids[$r]}; rcs[$r]=$?; done
  cat "$T/$name.0.log" "$T/$name.1.log" > "$T/$name.log"
  [ ${rcs[0]} -eq 0 ] && [ ${rcs[1]} -eq 0 ] && ok "$name: both ranks exit 0" \
    || bad "$name: ranks exit ${rcs[0]}, ${rcs[1]}: $(cat "$T/$name.log")"
  grep -v "^\[" "$T/$name.1.log" | grep -q . && bad "$name: rank 1 printed: $(cat "$T/$name.1.log")" || ok "$name: rank 1 quiet"
}

# 2. the Indexed Job
if [ -f "$DEP/k8s/indexed-job.yaml" ]; then
  k8s_check "$DEP/k8s/indexed-job.yaml" "$T/ij" indexed
  if [ -s "$T/ij.env" ] && [ -s "$T/ij.args" ]; then
    # the manifest's own WORLD_SIZE; only a manifest sized for more than 2 pods is simulated with 2
    ws=$(awk -F'\t' '$1 == "WORLD_SIZE" { print $2 }' "$T/ij.env"); ow=()
    [ -n "$ws" ] && [ "$ws" != 2 ] && { ow=(0:WORLD_SIZE=2 1:WORLD_SIZE=2); echo "note: WORLD_SIZE is $ws; simulated with 2"; }
    k8s_job indexed-job "$T/ij" "${ow[@]}" -- "${short[@]}" --max-steps 6
    one_job "indexed-job" "$T/indexed-job.log" "$T/indexed-job-ckpt" 6
    # pods replaced after a failure: the same env resumes from the checkpoint volume
    k8s_job indexed-job "$T/ij" "${ow[@]}" -- "${short[@]}" --max-steps 9
    grep -qF "resumed from $(ckname "$T/indexed-job-ckpt" 6)" "$T/indexed-job.log" \
      && ok "indexed-job: new pods resume from step-6.ckpt" || bad "indexed-job: no resume: $(cat "$T/indexed-job.log")"
  else
    bad "indexed-job: no env/args extracted"
  fi
fi

# 3. the PyTorchJob: the operator's variables, the template's env and args
if [ -f "$DEP/k8s/pytorchjob.yaml" ]; then
  k8s_check "$DEP/k8s/pytorchjob.yaml" "$T/pj" pytorchjob
  if [ -s "$T/pj.args" ]; then
    op=(0:RANK=0 1:RANK=1 0:WORLD_SIZE=2 1:WORLD_SIZE=2 0:PET_NODE_RANK=0 1:PET_NODE_RANK=1 0:PET_NNODES=2 1:PET_NNODES=2
        0:PYTHONUNBUFFERED=1 1:PYTHONUNBUFFERED=1)
    k8s_job pytorchjob "$T/pj" "${op[@]}" -- "${short[@]}" --max-steps 6
    one_job "pytorchjob" "$T/pytorchjob.log" "$T/pytorchjob-ckpt" 6
  else
    bad "pytorchjob: no args extracted"
  fi
fi

# ================================================================================================
# 4. the Dockerfile: a lint, and its runtime packages against what this tessera links
D=$DEP/Dockerfile
if [ -f "$D" ]; then
  # instructions: continuation lines joined, comments and blank lines dropped (a leading "# syntax=" is a comment)
  awk '/^[ \t]*#/ && !cont { next } { line = cont ? line " " $0 : $0; cont = sub(/\\[ \t]*$/, "", line); if (!cont) { if (line ~ /[^ \t]/) print line; line = "" } }' \
    "$D" > "$T/docker.ins"
  unknown=$(awk '{ print toupper($1) }' "$T/docker.ins" | grep -vxE 'FROM|RUN|CMD|LABEL|EXPOSE|ENV|ADD|COPY|ENTRYPOINT|VOLUME|USER|WORKDIR|ARG|ONBUILD|STOPSIGNAL|HEALTHCHECK|SHELL' | sort -u | tr '\n' ' ')
  [ -z "$unknown" ] && ok "Dockerfile: every instruction is known ($(wc -l < "$T/docker.ins") instructions)" \
    || bad "Dockerfile: unknown instructions: $unknown"
  grep -qvE '^[ \t]*[A-Za-z]+[ \t]' "$T/docker.ins" && bad "Dockerfile: an instruction without arguments: $(grep -vE '^[ \t]*[A-Za-z]+[ \t]' "$T/docker.ins")"
  [ "$(awk 'toupper($1) != "ARG" { print toupper($1); exit }' "$T/docker.ins")" = FROM ] && ok "Dockerfile: starts with FROM" \
    || bad "Dockerfile: the first instruction is not FROM"
  grep -qiE '^FROM +debian:bookworm' "$T/docker.ins" && ok "Dockerfile: FROM debian:bookworm" || bad "Dockerfile: not based on debian:bookworm"
  stages=$(awk 'toupper($1) == "FROM" && toupper($3) == "AS" { print $4 }' "$T/docker.ins")
  for s in $(grep -oE -- '--from=[^ ]+' "$T/docker.ins" | cut -d= -f2); do
    grep -qx "$s" <<<"$stages" && ok "Dockerfile: COPY --from=$s names a stage" || bad "Dockerfile: COPY --from=$s: no such stage"
  done
  grep -qE 'TS_WITH_PYTHON=0 +[^ ]*scripts/install-deps' "$T/docker.ins" && ok "Dockerfile: TS_WITH_PYTHON=0 scripts/install-deps" \
    || bad "Dockerfile: does not run scripts/install-deps with TS_WITH_PYTHON=0"
  grep -qE 'make +install .*PREFIX=/usr/local' "$T/docker.ins" && ok "Dockerfile: make install PREFIX=/usr/local" \
    || bad "Dockerfile: no make install PREFIX=/usr/local"
  ep=$(awk 'toupper($1) == "ENTRYPOINT" { $1 = ""; e = $0 } END { print e }' "$T/docker.ins")
  if [ -n "$PY" ] || PYJ=$(bash "$ROOT/tests/find_python.sh" json 2>/dev/null); then
    "${PY:-$PYJ}" -c 'import json,sys; v=json.loads(sys.argv[1]); sys.exit(0 if v and v[0] in ("tessera","/usr/local/bin/tessera") else 1)' "$ep" \
      && ok "Dockerfile: ENTRYPOINT $ep (exec form)" || bad "Dockerfile: ENTRYPOINT '$ep' is not [\"tessera\", ...]"
  else
    [[ "$ep" =~ ^\ *\[\ *\"(/usr/local/bin/)?tessera\" ]] && ok "Dockerfile: ENTRYPOINT $ep" || bad "Dockerfile: ENTRYPOINT '$ep'"
  fi
  [ -f "$D.dockerignore" ] && grep -qx 'build\*' "$D.dockerignore" && ok "Dockerfile.dockerignore leaves build folders out" \
    || bad "no deploy/Dockerfile.dockerignore leaving build*/ out of the context"
  # the runtime stage (after the last FROM) installs the Debian package of every library tessera needs
  runtime=$(awk 'toupper($1) == "FROM" { s = "" } { s = s $0 "\n" } END { printf "%s", s }' "$T/docker.ins")
  if command -v dpkg >/dev/null && command -v readelf >/dev/null && command -v ldd >/dev/null; then
    missing=""; checked=0
    for lib in $(readelf -d "$TS" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      path=$(ldd "$TS" | awk -v l="$lib" '$1 == l { print $3 }')
      [ -n "$path" ] || continue
      pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -1 | cut -d: -f1)
      [ -n "$pkg" ] || pkg=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1)
      case $pkg in
        "") echo "note: $lib ($path) belongs to no Debian package; not checked" ;;
        libc6|libgcc-s1|libstdc++6|zlib1g|libasan*|libubsan*|liblsan*|libtsan*) ;;  # in every image / sanitizer builds
        *cuda*|*cudnn*|*cublas*|*nccl*|*nvidia*) echo "note: $lib ($pkg) is CUDA's; the image is CPU-only" ;;
        *) checked=$((checked + 1)); grep -qw -- "$pkg" <<<"$runtime" || missing+="$pkg ($lib) " ;;
      esac
    done
    [ -z "$missing" ] && ok "Dockerfile: the runtime stage installs the packages of the $checked libraries tessera links" \
      || bad "Dockerfile: the runtime stage lacks $missing"
  else
    echo "note: no dpkg/readelf/ldd: the runtime packages were not checked against the binary"
  fi
fi

cli_summary
