// Bounds of the airlock API's requests, by schema and field.
//
// Generated from api/openapi.json by internal/server's TestSDKBoundsCommitted
// (AIRLOCK_UPDATE=1 go test ./internal/server -run TestSDKBoundsCommitted). Do not edit.

export const BOUNDS: Record<string, Record<string, Record<string, number>>> = {
    "BoxSpec": {
        "allow_host_ports": {"maxItems": 64},
        "allow_net": {"maxItems": 256},
        "cpus": {"maximum": 64, "minimum": 0},
        "disk_size_mib": {"maximum": 1048576, "minimum": 0},
        "env": {"maxItems": 1024},
        "from_snapshot": {"maxLength": 128},
        "idle_timeout": {"minimum": 0},
        "image": {"maxLength": 512},
        "lease": {"minimum": 0},
        "memory_mib": {"maximum": 262144, "minimum": 0},
        "name": {"maxLength": 128},
        "ports": {"maxItems": 64},
        "ttl": {"minimum": 0},
        "user": {"maxLength": 256},
        "volumes": {"maxItems": 32},
        "working_dir": {"maxLength": 4096},
    },
    "CheckpointRequest": {
        "name": {"maxLength": 64},
    },
    "Event": {
        "dropped": {"minimum": 0},
        "exec_id": {"minimum": 0},
        "seq": {"minimum": 0},
    },
    "ExecRequest": {
        "cmd": {"maxItems": 4096},
        "cols": {"maximum": 10000, "minimum": 0},
        "env": {"maxItems": 1024},
        "rows": {"maximum": 10000, "minimum": 0},
        "timeout": {"minimum": 0},
        "user": {"maxLength": 256},
        "working_dir": {"maxLength": 4096},
    },
    "ForkRequest": {
        "from_checkpoint": {"maxLength": 64},
        "n": {"maximum": 64, "minimum": 0},
    },
    "InstallRequest": {
        "index_url": {"maxLength": 2048},
        "packages": {"maxItems": 256},
    },
    "MkdirRequest": {
        "mode": {"maximum": 4095, "minimum": 0},
        "path": {"maxLength": 4096},
    },
    "NetworkStats": {
        "bytes_in": {"minimum": 0},
        "bytes_out": {"minimum": 0},
        "connections": {"minimum": 0},
        "denied": {"minimum": 0},
        "dns_queries": {"minimum": 0},
    },
    "PortSpec": {
        "guest_port": {"maximum": 65535, "minimum": 1},
        "host_ip": {"maxLength": 64},
        "host_port": {"maximum": 65535, "minimum": 0},
    },
    "PullRequest": {
        "ref": {"maxLength": 512},
    },
    "RunRequest": {
        "timeout": {"minimum": 0},
    },
    "SecretSpec": {
        "hosts": {"maxItems": 16},
    },
    "SetSecretInputBody": {
        "value": {"maxLength": 8192},
    },
    "SnapshotRequest": {
        "name": {"maxLength": 128},
    },
    "VolumeSpec": {
        "source": {"maxLength": 4096},
        "target": {"maxLength": 4096},
    },
};
