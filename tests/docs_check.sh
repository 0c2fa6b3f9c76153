#!/usr/bin/env bash
# tests/docs_check.sh — the user documents (README.md, docs/*.md) against the code:
#   1. README.md is a front door: at most 250 lines;
#   2. every relative link in README.md and docs/*.md names a file that exists, and its #anchor (GitHub's
#      heading slugs) a heading of that file;
#   3. every flag that `tessera COMMAND [SUBCOMMAND] --help` prints, for every command `tessera --help` lists
#      and every subcommand those list, appears in docs/cli.md inside that command's section (the heading that
#      names `tessera COMMAND [SUBCOMMAND]`, up to the next heading of the same or a higher level);
#   4. no project-history words in user documents (docs/design.md, the developers' map of the code, is left out).
#   5. (place for the environment check: every TS_* variable the code reads has a row in docs/env.md)
#
# usage: docs_check.sh path/to/tessera [SOURCE_DIR]   (SOURCE_DIR: default, this script's repository)
set -u
TS=${1:?usage: docs_check.sh path/to/tessera [SOURCE_DIR]}
SRC=${2:-$(cd "$(dirname "$0")/.." && pwd)}
[ -x "$TS" ] || { echo "FAIL: $TS is not an executable"; exit 1; }
cd "$SRC" || exit 1
export LC_ALL=C
fails=0; passes=0
ok()  { passes=$((passes+1)); }
bad() { fails=$((fails+1)); echo "FAIL: $*"; }
DOCS=(README.md docs/*.md)

# ---- 1. README.md's length ----------------------------------------------------------------------------------
n=$(wc -l < README.md)
if [ "$n" -le 250 ]; then ok; echo "ok: README.md has $n lines (at most 250)"; else bad "README.md has $n lines (at most 250)"; fi

# ---- 2. relative links and their anchors -------------------------------------------------------------------
# headings FILE: the GitHub slugs of FILE's headings outside code fences (duplicates get -1, -2, ...)
headings() {
  awk '/^```/ { fence = !fence; next }
       !fence && /^#+ / {
         h = $0; sub(/^#+ +/, "", h); h = tolower(h)
         gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h)
         if (h in seen) { seen[h]++; print h "-" seen[h] } else { seen[h] = 0; print h }
       }' "$1"
}
# links FILE: the targets of [text](target) outside code fences and inline code
links() {
  awk '/^```/ { fence = !fence; next }
       !fence { line = $0; gsub(/`[^`]*`/, "", line)
                while (match(line, /\]\([^)]+\)/)) { print substr(line, RSTART + 2, RLENGTH - 3); line = substr(line, RSTART + RLENGTH) } }' "$1"
}
nlinks=0
for f in "${DOCS[@]}"; do
  dir=$(dirname "$f")
  while IFS= read -r target; do
    case "$target" in http://*|https://*|mailto:*) continue ;; esac
    nlinks=$((nlinks+1))
    path=${target%%#*}; anchor=""
    case "$target" in *'#'*) anchor=${target#*#} ;; esac
    if [ -z "$path" ]; then file=$f; else file=$dir/$path; fi
    if [ ! -e "$file" ]; then bad "$f: link '$target': $file does not exist"; continue; fi
    if [ -n "$anchor" ]; then
      case "$file" in
        *.md) if headings "$file" | grep -qxF -- "$anchor"; then ok; else bad "$f: link '$target': no heading '#$anchor' in $file"; fi ;;
        *) ok ;;
      esac
    else ok; fi
  done < <(links "$f")
done
echo "ok: checked $nlinks relative links in ${#DOCS[@]} files"

# ---- 3. every flag of every command's --help in docs/cli.md ------------------------------------------------
CLI=docs/cli.md
# section PATH: the lines of docs/cli.md from the heading naming `tessera PATH` to the next heading of its level or above
section() {
  awk -v want="\`tessera $1\`" '
    /^```/ { fence = !fence }
    !fence && /^#+ / { lvl = index($0, " ") - 1
                       if (on && lvl <= level) exit
                       if (!on && index($0, want) && substr($0, index($0, want) + length(want), 1) !~ /[a-z-]/) { on = 1; level = lvl } }
    on' "$CLI"
}
# flags_of TEXT...: the long flags and one-letter short flags a help text prints (not --help/-h)
flags_of() {
  grep -oE -- '(^|[^A-Za-z0-9-])--?[a-z][a-z0-9-]*' | sed -E 's/^[^-]*//' | awk 'length($0) > 2 && /^--/ || /^-[a-z]$/' |
    grep -vxE -- '--help|-h' | sort -u
}
has_flag() { grep -qE -- "(^|[^A-Za-z0-9-])$1([^A-Za-z0-9-]|$)"; }
# subcommands of a command: the words its help lists as "  WORD   description" that take --help themselves
subcommands() {
  local out; out=$("$TS" $1 --help 2>&1) || return 0
  sed -nE 's/^  ([a-z]+)  +[A-Za-z(].*/\1/p' <<<"$out" | sort -u | while read -r w; do
    "$TS" $1 "$w" --help >/dev/null 2>&1 && echo "$w"
  done
}
top=$("$TS" --help | sed -nE 's/^  ([a-z]+)  +.*/\1/p')
[ -n "$top" ] || bad "'tessera --help' lists no commands"
nflags=0; ncmds=0
for cmd in $top; do
  grep -qF -- "\`tessera $cmd" "$CLI" || bad "$CLI never mentions \`tessera $cmd\`"
  paths=$cmd
  for sub in $(subcommands "$cmd"); do paths="$paths|$cmd $sub"; done
  IFS='|' read -r -a plist <<<"$paths"
  for p in "${plist[@]}"; do
    help=$("$TS" $p --help 2>&1)
    flags=$(flags_of <<<"$help")
    [ -n "$flags" ] || continue
    ncmds=$((ncmds+1))
    sec=$(section "$p")
    if [ -z "$sec" ]; then bad "$CLI has no section headed \`tessera $p\` (its --help prints: $(echo $flags))"; continue; fi
    for fl in $flags; do
      nflags=$((nflags+1))
      if has_flag "$fl" <<<"$sec"; then ok; else bad "$CLI: \`tessera $p\`'s section does not document $fl (printed by 'tessera $p --help')"; fi
    done
  done
done
echo "ok: checked $nflags flags of $ncmds commands against $CLI"

# ---- 4. no project-history words in user documents ---------------------------------------------------------
USER_DOCS=()
for f in "${DOCS[@]}"; do [ "$f" = docs/design.md ] || USER_DOCS+=("$f"); done
hist=$(grep -inE 'issue [0-9]|seed 00[0-9]|closing run|this session' "${USER_DOCS[@]}")
if [ -z "$hist" ]; then ok; echo "ok: no history words in ${#USER_DOCS[@]} user documents"
else bad "project-history words in user documents:"; echo "$hist"; fi

# ---- 5. environment variables (docs/env.md) ----------------------------------------------------------------
# The registry (src/core/env.c, listed by `tessera env --json`, one variable per line) against docs/env.md:
# every registered variable has a row in the section the registry names, docs/env.md has no row for a TS_*
# name the registry does not know (but in "Building and testing": the scripts' and tests' own variables),
# and no code in src/ or tools/ reads a TS_* variable except through the registry.
ENV_MD=docs/env.md
reg=$("$TS" env --json | sed -nE 's/^  \{"name": "(TS_[A-Z0-9_]+)", "section": "([^"]*)".*/\1|\2/p')
nreg=$(grep -c . <<<"$reg")
[ "$nreg" -ge 20 ] || bad "'tessera env --json' lists $nreg variables (the registry is larger)"
# rows NAME|SECTION: the TS_* names in the first cell of each table row, with the ## heading above it
rows=$(awk '/^```/ { fence = !fence; next }
            !fence && /^## / { sec = substr($0, 4) }
            !fence && /^\| *`TS_/ { split($0, cell, "|"); c = cell[2]
                                    while (match(c, /`TS_[A-Z0-9_]+/)) { print substr(c, RSTART + 1, RLENGTH - 1) "|" sec; c = substr(c, RSTART + RLENGTH) } }' "$ENV_MD")
nenv=0
while IFS='|' read -r name sec; do
  [ -n "$name" ] || continue
  nenv=$((nenv+1))
  row=$(grep -m1 "^$name|" <<<"$rows")
  if [ -z "$row" ]; then bad "$ENV_MD has no row for $name (registered in src/core/env.c, section '$sec')"
  elif [ "${row#*|}" != "$sec" ]; then bad "$ENV_MD lists $name under '${row#*|}'; the registry says '$sec'"
  else ok; fi
done <<<"$reg"
while IFS='|' read -r name sec; do
  [ -n "$name" ] && [ "$sec" != "Building and testing" ] || continue
  if grep -q "^$name|" <<<"$reg"; then ok; else bad "$ENV_MD has a row for $name, which src/core/env.c does not register"; fi
done <<<"$rows"
stray=$(grep -rnE 'getenv\("TS_|env_get\("TS_' src tools --include='*.c' --include='*.h' --include='*.cu' | grep -v '^src/core/env\.[ch]:')
if [ -z "$stray" ]; then ok; echo "ok: $nenv registered variables have their rows in $ENV_MD; none read outside src/core/env.c"
else bad "TS_* variables read outside the registry (use core/env.h's accessors):"; echo "$stray"; fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
