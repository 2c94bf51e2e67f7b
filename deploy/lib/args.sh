# Sourced (not run) by the deploy scripts to check their command line before they create a
# file or start a process:
#
#   source "$(dirname "$(readlink -f "$0")")/lib/args.sh"
#   while [[ $# -gt 0 ]]; do
#       case "$1" in
#           --port) need_value "$@"; port="$2"; shift 2 ;;
#   ...
#   port_number --port "$port"
#
# A failed check prints "<script>.sh: what is wrong" on stderr and exits with code 2.
# shellcheck shell=bash

script=$(basename "$(readlink -f "$0")")  # the script's own name, also when run through a link

# die MESSAGE...: a bad argument; stop before anything is created
die() {
    echo "$script: $*" >&2
    exit 2
}

# usage: the script's --help, its header comment (the comment lines after the shebang), then
# exit 0
usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 0
}

# need_value "$@" for an option that takes a value: it must be followed by one (an empty
# value is one; the end of the line or the next --option is not)
need_value() {
    [[ $# -ge 2 && $2 != --* ]] || die "$1 needs a value"
}

# uint OPTION VALUE: a non-negative decimal integer 0, 1, 2, ... (no sign and no leading
# zeros: bash arithmetic reads 08 as octal, and TOML refuses it)
uint() {
    [[ $2 =~ ^(0|[1-9][0-9]*)$ ]] ||
        die "$1 must be a non-negative integer (0, 1, 2, ...; no sign or leading zeros), got '$2'"
    ((${#2} <= 18)) || die "$1 $2 is too large"
}

# positive OPTION VALUE: an integer >= 1 (1, 2, 3, ...)
positive() {
    [[ $2 =~ ^[1-9][0-9]*$ ]] ||
        die "$1 must be a positive integer (1, 2, 3, ...; no sign or leading zeros), got '$2'"
    ((${#2} <= 18)) || die "$1 $2 is too large"
}

# port_number OPTION VALUE: a TCP port, 1..65535
port_number() {
    if [[ ! $2 =~ ^[1-9][0-9]{0,4}$ ]] || (($2 > 65535)); then
        die "$1 must be a port number from 1 to 65535 (no sign or leading zeros), got '$2'"
    fi
}

# run_names EXPERIMENT METHOD [PATH...]: non-empty preset names, and no ' in them or in the
# paths (the run config quotes each with ')
run_names() {
    [[ -n $1 && -n $2 ]] || die "--experiment and --method must not be empty"
    local v
    for v in "$@"; do
        [[ $v != *"'"* ]] || die "quotes are not allowed in '$v'"
    done
}

# check_run_config APP EXPERIMENT METHOD SEED SET [OUTPUT_DIR [--resume|--fresh]]: build the
# run's configuration here, as the ServerApp will (fl_app.config.config_from_run_config, with
# APP's code: the experiment and method presets must exist, SET's keys, types and ranges must
# be valid) and print its num_clients. With OUTPUT_DIR (a folder on this machine), also ask
# the ServerApp's own check of what the run would do to its results directory there
# (fl_app.rundir.guard_run_dir: an unfinished run or a completed run of other settings
# that it must not replace, a resume the checkpoint refuses, a live run). Exits 2 with the
# error when either says no; when the project's code cannot be imported here (python3 is not
# the project's virtualenv) it warns, prints nothing and returns 0: the ServerApp checks anyway.
check_run_config() {
    PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}" python3 - "$script" "$@" <<'PY' || exit
import sys

script, _app, experiment, method, seed, overrides, *where = sys.argv[1:]
try:
    import numpy  # noqa: F401  the project's environment, without which the app's own
    import torch  # noqa: F401  modules report a missing package as a configuration error
    import yaml  # noqa: F401
    from fl_app.config import config_from_run_config, run_dir

    run_config = {"experiment": experiment, "method": method, "seed": int(seed), "set": overrides}
    if where:
        run_config["output-dir"] = where[0]
    cfg = config_from_run_config(run_config)
    if where:
        from fl_app.rundir import Stage, guard_run_dir

        flag = where[1] if len(where) > 1 else ""
        resume, fresh = flag == "--resume", flag == "--fresh"
        guard_run_dir(cfg, run_dir(cfg), resume=resume, fresh=fresh, stage=Stage.EARLY)
except ImportError as err:
    print(
        f"{script}: warning: cannot check the run configuration here ({err}; activate the"
        " project's virtualenv); the ServerApp checks it",
        file=sys.stderr,
    )
    sys.exit(0)
except (ValueError, RuntimeError) as err:  # ConfigError (or a --set value with an open
    print(f"{script}: {err}", file=sys.stderr)  # quote), RunDirBusyError
    sys.exit(2)
print(cfg["num_clients"])
PY
}
