// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// ioprio side channel: on every block request issue, if the request's disk
// is registered in `devices`, store the request's ioprio in the slot of its
// (hardware queue, tag) in the mmap-able array `slots`.
//
// Self-contained on purpose: no vmlinux.h, no libbpf headers, only clang.
// The few kernel structs below carry just the fields we read and are marked
// preserve_access_index, so every field access becomes a CO-RE relocation
// that the loader resolves against the running kernel's BTF; their layout
// here does not have to match any kernel.
//
// Why tp_btf/block_rq_issue: it fires in blk_mq_start_request(), which
// ublk's queue_rq calls before ublk_queue_cmd() completes the server's
// FETCH/COMMIT_AND_FETCH uring_cmd; the server only learns of the request
// (and reads its descriptor) from that completion, so the slot is written
// before the server can look at it. A BTF tracepoint receives the typed
// `struct request *` directly (no bpf_probe_read, no helper beyond the map
// lookups), and it is a stable hook present in every blk-mq kernel, unlike
// ublk's static, possibly inlined functions.

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

// BPF map types and flags (include/uapi/linux/bpf.h).
#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_F_MMAPABLE (1U << 10)

// Helper 1 is bpf_map_lookup_elem in every kernel.
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;

struct gendisk {
	int major;
	int first_minor;
} __attribute__((preserve_access_index));

struct request_queue {
	struct gendisk *disk;
} __attribute__((preserve_access_index));

struct blk_mq_hw_ctx {
	unsigned int queue_num;
} __attribute__((preserve_access_index));

struct bio {
	unsigned short bi_ioprio;
} __attribute__((preserve_access_index));

// Older kernels (6.12, the VM bench's, included) keep a copy of the priority
// in the request (rq->ioprio); newer ones (6.18 here) dropped it and read
// the first bio's (req_get_ioprio()). Both are declared; the program picks
// at load time.
struct request {
	struct request_queue *q;
	struct blk_mq_hw_ctx *mq_hctx;
	int tag;
	unsigned short ioprio;
	struct bio *bio;
} __attribute__((preserve_access_index));

// CO-RE "field exists" relocation (libbpf's bpf_core_field_exists): a
// constant the loader patches in from the running kernel's BTF. The
// branch not taken keeps a relocation that fails and is poisoned by the
// loader, which is fine: the verifier never walks dead code.
#define FIELD_EXISTS(field) __builtin_preserve_field_info(field, 2)

static __attribute__((always_inline)) __u16 request_ioprio(struct request *rq)
{
	struct bio *bio;

	if (FIELD_EXISTS(rq->ioprio))
		return rq->ioprio;
	bio = rq->bio;
	return bio ? bio->bi_ioprio : 0; // flushes carry no bio
}

// Value of `devices`; must match `DevEntry` in src/layout.rs.
struct dev_entry {
	__u32 base;          // first slot of this device
	__u16 nr_hw_queues;  // slots are base + hwq * queue_depth + tag
	__u16 queue_depth;
	__u16 generation;    // copied into every slot written for it
	__u16 _pad;
};

// Key: the kernel's dev_t of the whole disk, MAJOR << 20 | MINOR.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct dev_entry);
} devices SEC(".maps");

// One u64 per (device, hwq, tag): seq << 32 | generation << 16 | ioprio.
// max_entries is set by the loader.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} slots SEC(".maps");

SEC("tp_btf/block_rq_issue")
int ioprio_rq_issue(__u64 *ctx)
{
	struct request *rq = (struct request *)ctx[0];
	struct gendisk *disk = rq->q->disk;
	struct dev_entry *dev;
	__u64 *slot;
	__u32 devt, hwq, idx, seq;
	__u16 ioprio;
	__s32 tag;

	if (!disk)
		return 0;
	devt = ((__u32)disk->major << 20) | (__u32)disk->first_minor;
	dev = bpf_map_lookup_elem(&devices, &devt);
	if (!dev)
		return 0; // not ours: this early return is all other disks pay

	hwq = rq->mq_hctx->queue_num;
	tag = rq->tag;
	if (hwq >= dev->nr_hw_queues || tag < 0 || tag >= dev->queue_depth)
		return 0;
	idx = dev->base + hwq * dev->queue_depth + (__u32)tag;
	slot = bpf_map_lookup_elem(&slots, &idx);
	if (!slot)
		return 0;
	// A tag belongs to one request at a time, so nobody else writes this
	// slot concurrently: a plain read-increment-store of seq is enough.
	ioprio = request_ioprio(rq);
	seq = (__u32)(*slot >> 32) + 1;
	// One aligned 8-byte store: the reader sees the old or the new value,
	// never a mix (see the memory-ordering note in src/layout.rs).
	*(volatile __u64 *)slot = ((__u64)seq << 32) |
				  ((__u64)dev->generation << 16) |
				  (__u64)ioprio;
	return 0;
}

// Tracing programs must be GPL-compatible; the file is dual-licensed.
char LICENSE[] SEC("license") = "GPL";
