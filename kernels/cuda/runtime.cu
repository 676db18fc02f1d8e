/* The CUDA runtime pieces a model on the card needs besides kernels: pinned host
 * memory for staging and step inputs, the current device of a thread, device
 * queries that create no context, device copies, timing events, graph capture and
 * replay of a decode step, and memory and events shared with another process (the
 * card-to-card link between two stages). Each wraps one runtime call behind
 * KCUDA_CHECK. */
#include <stdio.h>
#include <string.h>

#include "kcuda_impl.cuh"

static_assert(sizeof(cudaIpcMemHandle_t) == KCUDA_IPC_HANDLE_BYTES, "an exported allocation's handle");
static_assert(sizeof(cudaIpcEventHandle_t) == KCUDA_IPC_HANDLE_BYTES, "an exported event's handle");

int kcuda_host_alloc(void **out, size_t nbytes, bl_err_t *err)
{
    *out = NULL;
    KCUDA_CHECK(cudaHostAlloc(out, nbytes ? nbytes : 1, cudaHostAllocDefault), err);
    return 0;
}

void kcuda_host_free(void *p)
{
    if (p)
        (void)cudaFreeHost(p); /* nothing to do about a failure at teardown */
}

int kcuda_set_device(int device, bl_err_t *err)
{
    KCUDA_CHECK(cudaSetDevice(device), err);
    return 0;
}

int kcuda_device_query(int device, kcuda_device_info_t *info, bl_err_t *err)
{
    memset(info, 0, sizeof *info);
    cudaDeviceProp p;
    KCUDA_CHECK(cudaGetDeviceProperties(&p, device), err);
    info->id = device;
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->total_bytes = p.totalGlobalMem;
    info->bus_bits = p.memoryBusWidth;
    return 0;
}

int kcuda_copy(void *d_dst, const void *d_src, size_t nbytes, void *stream, bl_err_t *err)
{
    KCUDA_CHECK(cudaMemcpyAsync(d_dst, d_src, nbytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream),
                err);
    return 0;
}

int kcuda_event_create(void **out, bl_err_t *err)
{
    cudaEvent_t ev = NULL;
    *out = NULL;
    KCUDA_CHECK(cudaEventCreate(&ev), err);
    *out = ev;
    return 0;
}

int kcuda_event_create_blocking(void **out, bl_err_t *err)
{
    cudaEvent_t ev = NULL;
    *out = NULL;
    KCUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventBlockingSync | cudaEventDisableTiming), err);
    *out = ev;
    return 0;
}

void kcuda_event_destroy(void *ev)
{
    if (ev)
        (void)cudaEventDestroy((cudaEvent_t)ev);
}

int kcuda_event_record(void *ev, void *stream, bl_err_t *err)
{
    /* Inside a capture an event becomes a timing node of the graph (External);
     * a plain record there would only order streams. */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    KCUDA_CHECK(cudaStreamIsCapturing((cudaStream_t)stream, &cs), err);
    KCUDA_CHECK(cudaEventRecordWithFlags((cudaEvent_t)ev, (cudaStream_t)stream,
                                         cs == cudaStreamCaptureStatusActive ? cudaEventRecordExternal
                                                                             : cudaEventRecordDefault),
                err);
    return 0;
}

int kcuda_event_sync(void *ev, bl_err_t *err)
{
    KCUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev), err);
    return 0;
}

int kcuda_event_elapsed_ms(float *ms, void *start, void *end, bl_err_t *err)
{
    KCUDA_CHECK(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end), err);
    return 0;
}

int kcuda_stream_after(void *waiter, void *signaler, void *ev, bl_err_t *err)
{
    KCUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)signaler), err);
    KCUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)waiter, (cudaEvent_t)ev, 0), err);
    return 0;
}

int kcuda_graph_begin(void *stream, bl_err_t *err)
{
    if (!stream)
        return bl_err_set(err, BL_EINVAL, "graph capture needs a non-default stream");
    /* Thread-local: another thread's unrelated CUDA calls (a second model's step, a
     * download) neither join nor break this capture. */
    KCUDA_CHECK(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal), err);
    return 0;
}

int kcuda_graph_end(void *stream, void **exec, bl_err_t *err)
{
    *exec = NULL;
    cudaGraph_t g = NULL;
    KCUDA_CHECK(cudaStreamEndCapture((cudaStream_t)stream, &g), err);
    cudaGraphExec_t x = NULL;
    const cudaError_t rc = cudaGraphInstantiate(&x, g, 0);
    (void)cudaGraphDestroy(g); /* the executable graph keeps what it needs */
    KCUDA_CHECK(rc, err);
    *exec = x;
    return 0;
}

int kcuda_graph_launch(void *exec, void *stream, bl_err_t *err)
{
    KCUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream), err);
    return 0;
}

void kcuda_graph_destroy(void *exec)
{
    if (exec)
        (void)cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

int kcuda_host_call(void *stream, void (*fn)(void *ctx), void *ctx, bl_err_t *err)
{
    KCUDA_CHECK(cudaLaunchHostFunc((cudaStream_t)stream, (cudaHostFn_t)fn, ctx), err);
    return 0;
}

int kcuda_host_register(const void *p, size_t nbytes, bl_err_t *err)
{
    /* read-only: the pages may be a file's mapping, which is never written */
    KCUDA_CHECK(cudaHostRegister((void *)p, nbytes, cudaHostRegisterReadOnly), err);
    return 0;
}

int kcuda_host_pin(void *p, size_t nbytes, bl_err_t *err)
{
    KCUDA_CHECK(cudaHostRegister(p, nbytes, cudaHostRegisterDefault), err);
    return 0;
}

void kcuda_host_unregister(const void *p)
{
    if (p)
        (void)cudaHostUnregister((void *)p);
}

int kcuda_stream_wait(void *stream, void *ev, bl_err_t *err)
{
    KCUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0), err);
    return 0;
}

int kcuda_can_access_peer(int device, int peer, int *can, bl_err_t *err)
{
    *can = 0;
    if (device == peer) {
        *can = 1;
        return 0;
    }
    KCUDA_CHECK(cudaDeviceCanAccessPeer(can, device, peer), err);
    return 0;
}

int kcuda_ipc_mem_export(const void *d_p, uint8_t handle[KCUDA_IPC_HANDLE_BYTES], bl_err_t *err)
{
    cudaIpcMemHandle_t h;
    KCUDA_CHECK(cudaIpcGetMemHandle(&h, (void *)d_p), err);
    memcpy(handle, &h, sizeof h);
    return 0;
}

int kcuda_ipc_mem_open(void **d_out, const uint8_t handle[KCUDA_IPC_HANDLE_BYTES], bl_err_t *err)
{
    *d_out = NULL;
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    /* another card's memory is mapped through peer access, which this turns on */
    KCUDA_CHECK(cudaIpcOpenMemHandle(d_out, h, cudaIpcMemLazyEnablePeerAccess), err);
    return 0;
}

void kcuda_ipc_mem_close(void *d_p)
{
    if (d_p)
        (void)cudaIpcCloseMemHandle(d_p); /* nothing to do about a failure at teardown */
}

int kcuda_ipc_event_create(void **out, bl_err_t *err)
{
    cudaEvent_t ev = NULL;
    *out = NULL;
    /* the runtime refuses an interprocess event that keeps timing */
    KCUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming), err);
    *out = ev;
    return 0;
}

int kcuda_ipc_event_export(void *ev, uint8_t handle[KCUDA_IPC_HANDLE_BYTES], bl_err_t *err)
{
    cudaIpcEventHandle_t h;
    KCUDA_CHECK(cudaIpcGetEventHandle(&h, (cudaEvent_t)ev), err);
    memcpy(handle, &h, sizeof h);
    return 0;
}

int kcuda_ipc_event_open(void **out, const uint8_t handle[KCUDA_IPC_HANDLE_BYTES], bl_err_t *err)
{
    cudaEvent_t ev = NULL;
    *out = NULL;
    cudaIpcEventHandle_t h;
    memcpy(&h, handle, sizeof h);
    KCUDA_CHECK(cudaIpcOpenEventHandle(&ev, h), err);
    *out = ev;
    return 0;
}
