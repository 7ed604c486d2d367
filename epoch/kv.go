package epoch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/streams"
)

// openBucket creates a bucket whose keys lapse TTL after their last write, leaving a
// marker that watchers see as a purge. An existing bucket is taken as it is (a node may
// not update it: streams.EnsureKV); the engine checks it against bucketConfig.
func openBucket(ctx context.Context, js jetstream.JetStream, name string, ttl time.Duration, replicas int, storage jetstream.StorageType) (jetstream.KeyValue, error) {
	kv, err := streams.EnsureKV(ctx, js, bucketConfig(name, ttl, replicas, storage))
	if err != nil {
		return nil, fmt.Errorf("epoch: open KV bucket %s: %w", name, err)
	}
	return kv, nil
}

func bucketConfig(name string, ttl time.Duration, replicas int, storage jetstream.StorageType) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         name,
		Description:    "flow ownership: keys lapse when their holder stops renewing",
		History:        1,
		TTL:            ttl,
		LimitMarkerTTL: max(defaultMarkerTTL, ttl),
		Storage:        storage,
		Replicas:       max(replicas, 1),
	}
}

// LeaderBucketConfig and LeaseBucketConfig are the buckets as NewElector and NewLeases
// create them for a lease TTL.
func LeaderBucketConfig(ttl time.Duration, replicas int) jetstream.KeyValueConfig {
	return bucketConfig(LeaderBucket, ttl, replicas, jetstream.FileStorage)
}

// LeaseBucketConfig: see LeaderBucketConfig.
func LeaseBucketConfig(ttl time.Duration, replicas int) jetstream.KeyValueConfig {
	return bucketConfig(LeaseBucket, ttl, replicas, jetstream.MemoryStorage)
}

// latest is a key's newest revision as the bucket stream's leader has it.
type latest struct {
	rev     uint64
	value   []byte
	deleted bool // a delete, purge or lapse marker
	found   bool
}

// readLatest reads a key through the stream leader rather than with kv.Get, which on
// a replicated bucket may be answered by any replica with an older revision
// (../shared/FACTS.md). Every decision made before a compare-and-set reads this way.
func readLatest(ctx context.Context, js jetstream.JetStream, bucket, key string) (latest, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": "$KV." + bucket + "." + key})
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	resp, err := js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+bucket, req)
	if err != nil {
		return latest{}, fmt.Errorf("epoch: read %s/%s: %w", bucket, key, err)
	}
	var r struct {
		Message *struct {
			Seq  uint64 `json:"seq"`
			Hdrs []byte `json:"hdrs"`
			Data []byte `json:"data"`
		} `json:"message"`
		Error *struct {
			Code    int    `json:"code"`
			ErrCode int    `json:"err_code"`
			Desc    string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return latest{}, fmt.Errorf("epoch: read %s/%s: %w", bucket, key, err)
	}
	if r.Error != nil {
		if r.Error.Code == 404 {
			return latest{}, nil
		}
		return latest{}, fmt.Errorf("epoch: read %s/%s: %s (code %d)", bucket, key, r.Error.Desc, r.Error.ErrCode)
	}
	if r.Message == nil {
		return latest{}, fmt.Errorf("epoch: read %s/%s: empty answer", bucket, key)
	}
	l := latest{rev: r.Message.Seq, value: r.Message.Data, found: true}
	if len(r.Message.Hdrs) > 0 {
		h, err := nats.DecodeHeadersMsg(r.Message.Hdrs)
		if err == nil && (h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != "") {
			l.deleted = true
		}
	}
	return l, nil
}

// withDefaultTimeout bounds a network call whose caller set no deadline. It is the one
// timer of this package on real time rather than Config.Clock: it decides nothing about
// ownership, it only stops a call the network swallowed, and it must fire even in a test
// whose fake clock stands still. (Contexts of withClockDeadline report no deadline, so
// calls under them get it too, as JetStream's own calls get its default timeout.)
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, 5*time.Second)
}

// isRevisionMismatch reports a compare-and-set conflict, on R1 or R3 (code 10164).
func isRevisionMismatch(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}
