/* rc_ops: every RC opcode between two RoCE stacks, for tools/interop.
 *
 * Built on the host against Debian's libibverbs and put into the rxe VM. Its peer is
 * railshift's shift_rc_ops (apps/src/rc_ops.rs), which speaks the same exchange and the same
 * plan: see that file for the protocol, the buffer layout and the patterns; both must agree
 * byte for byte.
 *
 *   rc_ops -d rxe0 -g 1 --initiator HOST   connect to HOST:18516 and run the seven operations
 *   rc_ops -d rxe0 -g 1 --target           wait on 18516, serve them, check what arrived
 *   rc_ops ... --initiator HOST --rnr-retry N            the RNR plan (one SEND), see rc_ops.rs
 *   rc_ops ... --target --rnr-timer T [--rnr-post-ms MS]  its target: no receive until MS
 *
 * Prints "RCOPS ok" and exits 0 when every check passed, else names each failure and exits 1.
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PORT 18516
#define BUF 65536
#define WRITE_OFF 0
#define WRITE_LEN 8192
#define WIMM_OFF 8192
#define WIMM_LEN 100
#define SEND_LEN 3000
#define SIMM_LEN 200
#define READ_OFF 16384
#define READ_LEN 8192
#define CAS_OFF 32768
#define FADD_OFF 32776
#define RECV_OFF 40960 /* receives land here, 4096 bytes apart */
#define READ_DST 49152 /* the initiator's READ lands here */
#define ATOMIC_DST 57344 /* the initiator's atomic results land here */
#define IMM_WIMM 0x12345678u
#define IMM_SIMM 0x0badcafeu

static int failures;
#define CHECK(cond, ...)                                                                       \
	do {                                                                                   \
		if (!(cond)) {                                                                 \
			printf("RCOPS FAIL: " __VA_ARGS__);                                    \
			printf("\n");                                                          \
			failures++;                                                            \
		}                                                                              \
	} while (0)

static uint8_t initiator_byte(size_t i) { return (uint8_t)(i * 7 + 1); }
static uint8_t target_byte(size_t i) { return (uint8_t)(i * 13 + 6); }

struct dest {
	uint32_t qpn, psn, rkey;
	uint64_t addr;
	uint8_t gid[16];
};

static void send_dest(int fd, const struct dest *d)
{
	char line[128], gid[33];
	for (int i = 0; i < 16; i++)
		sprintf(gid + 2 * i, "%02x", d->gid[i]);
	int n = snprintf(line, sizeof line, "%06x %06x %08x %016llx %s\n", d->qpn, d->psn,
			 d->rkey, (unsigned long long)d->addr, gid);
	if (write(fd, line, n) != n) {
		perror("write");
		exit(1);
	}
}

static void read_line(int fd, char *line, size_t cap)
{
	size_t n = 0;
	while (n + 1 < cap) {
		char c;
		if (read(fd, &c, 1) != 1) {
			fprintf(stderr, "the peer closed the exchange\n");
			exit(1);
		}
		if (c == '\n')
			break;
		line[n++] = c;
	}
	line[n] = 0;
}

static void recv_dest(int fd, struct dest *d)
{
	char line[128], gid[33];
	unsigned long long addr;
	read_line(fd, line, sizeof line);
	if (sscanf(line, "%x %x %x %llx %32s", &d->qpn, &d->psn, &d->rkey, &addr, gid) != 5 ||
	    strlen(gid) != 32) {
		fprintf(stderr, "bad exchange line: %s\n", line);
		exit(1);
	}
	d->addr = addr;
	for (int i = 0; i < 16; i++)
		sscanf(gid + 2 * i, "%2hhx", &d->gid[i]);
}

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static uint8_t *buf;

static void post_recv(uint64_t id, size_t off, uint32_t len)
{
	struct ibv_sge sge = {.addr = (uintptr_t)(buf + off), .length = len, .lkey = mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1}, *bad;
	if (ibv_post_recv(qp, &wr, &bad)) {
		perror("ibv_post_recv");
		exit(1);
	}
}

static struct ibv_wc wait_wc(void)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 30;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0) {
			fprintf(stderr, "ibv_poll_cq failed\n");
			exit(1);
		}
		if (n == 1)
			return wc;
		if (time(NULL) > end) {
			printf("RCOPS FAIL: no completion within 30 s\n");
			exit(1);
		}
	}
}

/* The RNR plan: -1 when not running it. */
static int rnr_retry = -1, rnr_timer = -1, rnr_post_ms = -1;

static void connect_qp(const struct dest *me, const struct dest *peer, int gidx)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
				.path_mtu = IBV_MTU_1024,
				.dest_qp_num = peer->qpn,
				.rq_psn = peer->psn,
				.max_dest_rd_atomic = 4,
				.min_rnr_timer = 12,
				.ah_attr = {.is_global = 1, .port_num = 1}};
	if (rnr_timer >= 0)
		a.min_rnr_timer = rnr_timer;
	memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
	a.ah_attr.grh.sgid_index = gidx;
	a.ah_attr.grh.hop_limit = 64;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER)) {
		perror("modify RTR");
		exit(1);
	}
	struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTS,
				.timeout = 14,
				.retry_cnt = 7,
				.rnr_retry = rnr_retry >= 0 ? rnr_retry : 7,
				.sq_psn = me->psn,
				.max_rd_atomic = 4};
	if (ibv_modify_qp(qp, &r,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
		perror("modify RTS");
		exit(1);
	}
}

/* Posts CMP_AND_SWP (compare 20, swap 30) into `cas_off` and FETCH_AND_ADD 7 into `fadd_off`
 * as one chain of two signaled WRs in a single ibv_post_send, so that the requester has both
 * to send at once, without waiting for their completions. */
static void post_two_atomics(size_t cas_off, size_t fadd_off, const struct dest *peer)
{
	struct ibv_sge sge[2] = {
		{.addr = (uintptr_t)(buf + cas_off), .length = 8, .lkey = mr->lkey},
		{.addr = (uintptr_t)(buf + fadd_off), .length = 8, .lkey = mr->lkey},
	};
	struct ibv_send_wr wr[2] = {
		{.wr_id = 1,
		 .sg_list = &sge[0],
		 .num_sge = 1,
		 .opcode = IBV_WR_ATOMIC_CMP_AND_SWP,
		 .send_flags = IBV_SEND_SIGNALED,
		 .next = &wr[1]},
		{.wr_id = 2,
		 .sg_list = &sge[1],
		 .num_sge = 1,
		 .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
		 .send_flags = IBV_SEND_SIGNALED},
	};
	struct ibv_send_wr *bad;
	wr[0].wr.atomic.remote_addr = peer->addr + CAS_OFF;
	wr[0].wr.atomic.rkey = peer->rkey;
	wr[0].wr.atomic.compare_add = 20;
	wr[0].wr.atomic.swap = 30;
	wr[1].wr.atomic.remote_addr = peer->addr + FADD_OFF;
	wr[1].wr.atomic.rkey = peer->rkey;
	wr[1].wr.atomic.compare_add = 7;
	if (ibv_post_send(qp, wr, &bad)) {
		perror("ibv_post_send");
		exit(1);
	}
}

static void post_send(enum ibv_wr_opcode op, size_t off, uint32_t len, const struct dest *peer,
		      uint64_t raddr, uint32_t imm, uint64_t compare_add, uint64_t swap)
{
	struct ibv_sge sge = {.addr = (uintptr_t)(buf + off), .length = len, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = op,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED},
			   *bad;
	wr.imm_data = htonl(imm);
	if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = peer->rkey;
		wr.wr.atomic.compare_add = compare_add;
		wr.wr.atomic.swap = swap;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = peer->rkey;
	}
	if (ibv_post_send(qp, &wr, &bad)) {
		perror("ibv_post_send");
		exit(1);
	}
	struct ibv_wc wc = wait_wc();
	CHECK(wc.status == IBV_WC_SUCCESS, "operation %d completed with %s", op,
	      ibv_wc_status_str(wc.status));
}

/* The RNR plan's initiator: one SEND of SEND_LEN bytes, which must succeed with rnr_retry 7
 * and end in IBV_WC_RNR_RETRY_EXC_ERR with a smaller count (the target never posts then). */
static void rnr_initiator(int fd)
{
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = SEND_LEN, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1,
				 .sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED},
			   *bad;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (ibv_post_send(qp, &wr, &bad)) {
		perror("ibv_post_send");
		exit(1);
	}
	struct ibv_wc wc = wait_wc();
	clock_gettime(CLOCK_MONOTONIC, &t1);
	enum ibv_wc_status want = rnr_retry == 7 ? IBV_WC_SUCCESS : IBV_WC_RNR_RETRY_EXC_ERR;
	const char *name = wc.status == IBV_WC_SUCCESS		 ? "IBV_WC_SUCCESS"
			   : wc.status == IBV_WC_RNR_RETRY_EXC_ERR ? "IBV_WC_RNR_RETRY_EXC_ERR"
								   : ibv_wc_status_str(wc.status);
	long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
	CHECK(wc.status == want, "SEND with rnr_retry %d completed with %s", rnr_retry, name);
	if (wc.status == want)
		printf("RCOPS rnr: SEND with rnr_retry %d completed with %s after %ld ms\n", rnr_retry,
		       name, ms);
	char line[128];
	if (write(fd, "done\n", 5) != 5)
		perror("write");
	read_line(fd, line, sizeof line);
	CHECK(!strcmp(line, "target ok"), "the target says: %s", line);
}

/* The RNR plan's target: no receive until rnr_post_ms after the exchange (never if -1); then
 * the SEND must arrive whole, or, never posted, nothing may complete. */
static void rnr_target(int fd)
{
	struct ibv_wc wc;
	char line[128];
	if (rnr_post_ms >= 0) {
		usleep(rnr_post_ms * 1000);
		post_recv(1, RECV_OFF, 4096);
		wc = wait_wc();
		CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
			      wc.byte_len == SEND_LEN,
		      "SEND after RNR: status %s opcode %d len %u", ibv_wc_status_str(wc.status),
		      wc.opcode, wc.byte_len);
	}
	read_line(fd, line, sizeof line);
	CHECK(!strcmp(line, "done"), "the initiator says: %s", line);
	if (rnr_post_ms >= 0) {
		int bad = 0;
		for (size_t i = 0; i < SEND_LEN && !bad; i++)
			bad = buf[RECV_OFF + i] != initiator_byte(i);
		CHECK(!bad, "SEND after RNR: data differs");
		if (!bad)
			printf("RCOPS rnr: receive posted after %d ms, %d bytes checked\n", rnr_post_ms,
			       SEND_LEN);
	} else {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n == 0, "no receive was posted, yet a completion (status %s)",
		      ibv_wc_status_str(wc.status));
		if (n == 0)
			printf("RCOPS rnr: no receive posted, none completed\n");
	}
	const char *verdict = failures ? "target failed\n" : "target ok\n";
	if (write(fd, verdict, strlen(verdict)) < 0)
		perror("write");
	usleep(200000); /* let the last ACKs go before the QP does */
}

int main(int argc, char **argv)
{
	const char *dev = "rxe0", *host = NULL;
	int gidx = 1, initiator = -1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-d") && i + 1 < argc)
			dev = argv[++i];
		else if (!strcmp(argv[i], "-g") && i + 1 < argc)
			gidx = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--initiator") && i + 1 < argc)
			initiator = 1, host = argv[++i];
		else if (!strcmp(argv[i], "--target"))
			initiator = 0;
		else if (!strcmp(argv[i], "--rnr-retry") && i + 1 < argc)
			rnr_retry = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--rnr-timer") && i + 1 < argc)
			rnr_timer = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--rnr-post-ms") && i + 1 < argc)
			rnr_post_ms = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: rc_ops [-d DEV] [-g GIDX] --initiator HOST [--rnr-retry N] | "
					"--target [--rnr-timer T [--rnr-post-ms MS]]\n");
			return 2;
		}
	}
	if (initiator < 0) {
		fprintf(stderr, "rc_ops: --initiator HOST or --target\n");
		return 2;
	}
	struct ibv_device **list = ibv_get_device_list(NULL);
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), dev))
			ctx = ibv_open_device(list[i]);
	if (!ctx) {
		fprintf(stderr, "no device %s\n", dev);
		return 1;
	}
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	buf = aligned_alloc(4096, BUF);
	for (size_t i = 0; i < BUF; i++)
		buf[i] = initiator ? initiator_byte(i) : target_byte(i);
	if (!initiator) {
		memset(buf + RECV_OFF, 0, 8192);
		uint64_t cas = 10, fadd = 100;
		memcpy(buf + CAS_OFF, &cas, 8);
		memcpy(buf + FADD_OFF, &fadd, 8);
	}
	mr = ibv_reg_mr(pd, buf, BUF,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_ATOMIC);
	struct ibv_qp_init_attr init = {.send_cq = cq,
					.recv_cq = cq,
					.cap = {.max_send_wr = 16,
						.max_recv_wr = 16,
						.max_send_sge = 1,
						.max_recv_sge = 1},
					.qp_type = IBV_QPT_RC};
	qp = ibv_create_qp(pd, &init);
	if (!pd || !cq || !mr || !qp) {
		fprintf(stderr, "verbs setup failed\n");
		return 1;
	}
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
				.port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
						   IBV_ACCESS_REMOTE_ATOMIC};
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
		perror("modify INIT");
		return 1;
	}
	int rnr_plan = rnr_retry >= 0 || rnr_timer >= 0;
	if (rnr_retry > 7 || rnr_timer > 31 || (rnr_retry >= 0 && !initiator) ||
	    (rnr_timer >= 0 && initiator) || (rnr_post_ms >= 0 && rnr_timer < 0)) {
		fprintf(stderr, "rc_ops: --rnr-retry 0..7 with --initiator, --rnr-timer 0..31 "
				"[--rnr-post-ms MS] with --target\n");
		return 2;
	}
	if (!initiator && !rnr_plan) {
		post_recv(1, RECV_OFF, 4096); /* WRITE_WITH_IMM consumes one */
		post_recv(2, RECV_OFF, 4096); /* SEND */
		post_recv(3, RECV_OFF + 4096, 4096); /* SEND_WITH_IMM */
	}
	struct dest me = {.qpn = qp->qp_num,
			  .psn = (uint32_t)(getpid() * 2654435761u) & 0xffffff,
			  .rkey = mr->rkey,
			  .addr = (uintptr_t)buf},
		    peer;
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gidx, &gid)) {
		perror("ibv_query_gid");
		return 1;
	}
	memcpy(me.gid, gid.raw, 16);

	int fd;
	if (initiator) {
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(PORT)};
		inet_pton(AF_INET, host, &sa.sin_addr);
		time_t end = time(NULL) + 60;
		for (;;) {
			fd = socket(AF_INET, SOCK_STREAM, 0);
			if (!connect(fd, (struct sockaddr *)&sa, sizeof sa))
				break;
			close(fd);
			if (time(NULL) > end) {
				perror("connect");
				return 1;
			}
			usleep(200000);
		}
		send_dest(fd, &me);
		recv_dest(fd, &peer);
	} else {
		int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(PORT)};
		if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1)) {
			perror("listen");
			return 1;
		}
		fd = accept(ls, NULL, NULL);
		/* One peer per run: closed now, a connection meant for the next run is refused
		 * (and retried) instead of queueing here and being reset when this one exits. */
		close(ls);
		recv_dest(fd, &peer);
	}
	connect_qp(&me, &peer, gidx);
	if (!initiator)
		send_dest(fd, &me);

	char line[128];
	if (rnr_plan && initiator) {
		rnr_initiator(fd);
	} else if (rnr_plan) {
		rnr_target(fd);
	} else if (initiator) {
		post_send(IBV_WR_RDMA_WRITE, WRITE_OFF, WRITE_LEN, &peer, peer.addr + WRITE_OFF, 0, 0,
			  0);
		post_send(IBV_WR_RDMA_WRITE_WITH_IMM, WIMM_OFF, WIMM_LEN, &peer,
			  peer.addr + WIMM_OFF, IMM_WIMM, 0, 0);
		post_send(IBV_WR_SEND, 0, SEND_LEN, &peer, 0, 0, 0, 0);
		post_send(IBV_WR_SEND_WITH_IMM, 4096, SIMM_LEN, &peer, 0, IMM_SIMM, 0, 0);
		post_send(IBV_WR_RDMA_READ, READ_DST, READ_LEN, &peer, peer.addr + READ_OFF, 0, 0, 0);
		post_send(IBV_WR_ATOMIC_CMP_AND_SWP, ATOMIC_DST, 8, &peer, peer.addr + CAS_OFF, 0, 10,
			  20);
		post_send(IBV_WR_ATOMIC_FETCH_AND_ADD, ATOMIC_DST + 8, 8, &peer, peer.addr + FADD_OFF,
			  0, 5, 0);
		for (size_t i = 0; i < READ_LEN; i++)
			if (buf[READ_DST + i] != target_byte(READ_OFF + i)) {
				CHECK(0, "READ byte %zu is %u, expected %u", i, buf[READ_DST + i],
				      target_byte(READ_OFF + i));
				break;
			}
		uint64_t cas, fadd;
		memcpy(&cas, buf + ATOMIC_DST, 8);
		memcpy(&fadd, buf + ATOMIC_DST + 8, 8);
		CHECK(cas == 10, "CAS returned %llu, expected 10", (unsigned long long)cas);
		CHECK(fadd == 100, "FADD returned %llu, expected 100", (unsigned long long)fadd);
		/* Two atomics outstanding at once: posted together, then both awaited. */
		post_two_atomics(ATOMIC_DST + 16, ATOMIC_DST + 24, &peer);
		for (int i = 0; i < 2; i++) {
			struct ibv_wc wc = wait_wc();
			CHECK(wc.status == IBV_WC_SUCCESS, "atomic %d of two outstanding completed with %s",
			      i, ibv_wc_status_str(wc.status));
		}
		memcpy(&cas, buf + ATOMIC_DST + 16, 8);
		memcpy(&fadd, buf + ATOMIC_DST + 24, 8);
		CHECK(cas == 20, "CAS (two outstanding) returned %llu, expected 20",
		      (unsigned long long)cas);
		CHECK(fadd == 105, "FADD (two outstanding) returned %llu, expected 105",
		      (unsigned long long)fadd);
		if (write(fd, "done\n", 5) != 5)
			perror("write");
		read_line(fd, line, sizeof line);
		CHECK(!strcmp(line, "target ok"), "the target says: %s", line);
	} else {
		struct ibv_wc wc[3];
		for (int i = 0; i < 3; i++)
			wc[i] = wait_wc();
		CHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
			      ntohl(wc[0].imm_data) == IMM_WIMM,
		      "WRITE_WITH_IMM: status %s opcode %d imm %08x",
		      ibv_wc_status_str(wc[0].status), wc[0].opcode, ntohl(wc[0].imm_data));
		CHECK(wc[1].status == IBV_WC_SUCCESS && wc[1].opcode == IBV_WC_RECV &&
			      wc[1].byte_len == SEND_LEN && !(wc[1].wc_flags & IBV_WC_WITH_IMM),
		      "SEND: status %s opcode %d len %u", ibv_wc_status_str(wc[1].status),
		      wc[1].opcode, wc[1].byte_len);
		CHECK(wc[2].status == IBV_WC_SUCCESS && wc[2].opcode == IBV_WC_RECV &&
			      wc[2].byte_len == SIMM_LEN && (wc[2].wc_flags & IBV_WC_WITH_IMM) &&
			      ntohl(wc[2].imm_data) == IMM_SIMM,
		      "SEND_WITH_IMM: status %s opcode %d len %u imm %08x",
		      ibv_wc_status_str(wc[2].status), wc[2].opcode, wc[2].byte_len,
		      ntohl(wc[2].imm_data));
		read_line(fd, line, sizeof line);
		CHECK(!strcmp(line, "done"), "the initiator says: %s", line);
		int bad = 0;
		for (size_t i = 0; i < WRITE_LEN && !bad; i++)
			bad = buf[WRITE_OFF + i] != initiator_byte(WRITE_OFF + i);
		CHECK(!bad, "WRITE data differs");
		for (size_t i = 0; i < WIMM_LEN && !bad; i++)
			bad = buf[WIMM_OFF + i] != initiator_byte(WIMM_OFF + i);
		CHECK(!bad, "WRITE_WITH_IMM data differs");
		for (size_t i = 0; i < SEND_LEN && !bad; i++)
			bad = buf[RECV_OFF + i] != initiator_byte(i);
		CHECK(!bad, "SEND data differs");
		for (size_t i = 0; i < SIMM_LEN && !bad; i++)
			bad = buf[RECV_OFF + 4096 + i] != initiator_byte(4096 + i);
		CHECK(!bad, "SEND_WITH_IMM data differs");
		uint64_t cas, fadd;
		memcpy(&cas, buf + CAS_OFF, 8);
		memcpy(&fadd, buf + FADD_OFF, 8);
		CHECK(cas == 30, "CAS left %llu, expected 30", (unsigned long long)cas);
		CHECK(fadd == 112, "FADD left %llu, expected 112", (unsigned long long)fadd);
		const char *verdict = failures ? "target failed\n" : "target ok\n";
		if (write(fd, verdict, strlen(verdict)) < 0)
			perror("write");
		usleep(200000); /* let the last ACKs go before the QP does */
	}
	printf(failures ? "RCOPS %d failures\n" : "RCOPS ok\n", failures);
	return failures ? 1 : 0;
}
