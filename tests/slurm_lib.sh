# Functions shared by the Slurm test set-ups (tests/slurm_cluster.sh, one
# node; tests/cluster/slurm_node_down_test.sh, hosts of cluster.sh). Only
# definitions: sourcing it starts nothing.

# slurm_munged DIR: a munged of its own (key, socket, files in DIR/munge,
# output in DIR/munged.out), so a system munged is not disturbed; sets
# munge_pid and waits (up to 5 s) for its socket.
slurm_munged() {
    local dir=$1
    mkdir -p "$dir/munge"
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 700 "$dir/munge"
    chmod 400 "$dir/munge/munge.key"
    munged --force --foreground --key-file="$dir/munge/munge.key" \
        --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
        --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" \
        >"$dir/munged.out" 2>&1 &
    munge_pid=$!
    for _ in $(seq 50); do [ -S "$dir/munge/munge.socket" ] && break; sleep 0.1; done
}

# slurm.conf lines every test cluster has: users and munge auth over
# SOCKET (slurm_conf_auth SOCKET), and the plugins (slurm_conf_plugins).
slurm_conf_auth() {
    cat <<CONF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$1
CredType=cred/munge
CONF
}
slurm_conf_plugins() {
    cat <<'CONF'
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=pmix
CONF
}
