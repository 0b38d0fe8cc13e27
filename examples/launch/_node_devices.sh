# Sourced by master.sh and worker.sh (after they define `launch`): this node's devices as
# `ray start` arguments (ray_devices), its CPU count (NUM_CPUS), and the collective settings the
# Ray workers started on this node inherit (so they are exported before `ray start`).
if [[ -z ${DEVICE_TYPE:-} || -z ${NUM_DEVICES:-} ]]; then
    read -r found_type found_count <<<"$(launch detect-devices --type "${DEVICE_TYPE:-auto}")"
    DEVICE_TYPE=${DEVICE_TYPE:-$found_type}
    NUM_DEVICES=${NUM_DEVICES:-$found_count}
fi
ray_devices=()
case "$DEVICE_TYPE" in
    npu)
        ray_devices=(--resources "{\"NPU\": $NUM_DEVICES}")
        # read by the workers Ray starts on this node: set before `ray start`
        export HCCL_CONNECT_TIMEOUT=${HCCL_CONNECT_TIMEOUT:-1800}
        export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
        ;;
    gpu)
        ray_devices=(--num-gpus "$NUM_DEVICES")
        export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
        ;;
    cpu) ;;
    *) echo "error: DEVICE_TYPE must be npu, gpu or cpu, not '$DEVICE_TYPE'" >&2; exit 2 ;;
esac
if [[ $DEVICE_TYPE == cpu ]]; then
    NUM_CPUS=${NUM_CPUS:-$NUM_DEVICES}
else
    NUM_CPUS=${NUM_CPUS:-$(launch detect-devices --type cpu | cut -d' ' -f2)}
fi
