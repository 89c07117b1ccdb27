package idemgrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// ClientConfig configures [UnaryClientInterceptor]. The zero value (or
// nil) gives every call of the channel a key in the metadata.
type ClientConfig struct {
	// Methods names the calls that get a key: full method names
	// ("/rides.v1.Rides/CreateRide") or services ("rides.v1.Rides"). Empty:
	// every call.
	Methods []string

	// KeyField names the string field of the requests that carries the key
	// where the service reads one there (AIP-155's request_id): a request
	// that sets it keeps its key, and no metadata entry is added (the
	// server refuses a field and an entry that disagree). A request that
	// leaves it empty gets the fresh key in the metadata, which the server
	// copies into the field; the request message is never changed, so a
	// message reused for the next call does not carry this call's key.
	KeyField string

	// NewKey makes a key. Default: a random UUID (version 4), which every
	// service accepts, Config.UUIDKeys or not.
	NewKey func() string
}

// UnaryClientInterceptor returns a client interceptor that gives each
// logical call a fresh idempotency key in the "idempotency-key" metadata
// entry, unless the call carries one already (in its outgoing metadata, or
// in ClientConfig.KeyField of its request): retry code that sends the key
// of a failed answer again (see [ResponseKey]) keeps it.
//
// The key is made once per call, above grpc-go's own retries: a channel's
// retry policy (see [ServiceConfig]) and its transparent retries re-send
// the call's metadata, so every attempt of one call carries the same key,
// and the server resumes or replays it instead of running it twice. A new
// call, even with the same message, is a new request with a new key.
//
//	conn, err := grpc.NewClient(target, creds,
//		grpc.WithDefaultServiceConfig(serviceConfig),
//		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))
func UnaryClientInterceptor(cfg *ClientConfig) grpc.UnaryClientInterceptor {
	var c ClientConfig
	if cfg != nil {
		c = *cfg
	}
	newKey := c.NewKey
	if newKey == nil {
		newKey = uuid.NewString
	}
	methods := map[string]bool{}
	for _, m := range c.Methods {
		methods[m] = true
	}
	keyed := func(method string) bool {
		if len(methods) == 0 || methods[method] {
			return true
		}
		service, _, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
		return methods[service]
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if keyed(method) && !hasKey(ctx, req, c.KeyField) {
			ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, newKey())
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// hasKey reports whether a call carries a key: a non-empty metadata entry,
// or the request's key field set.
func hasKey(ctx context.Context, req any, field string) bool {
	md, _ := metadata.FromOutgoingContext(ctx)
	for _, v := range md.Get(MetadataKey) {
		if v != "" {
			return true
		}
	}
	msg, ok := req.(proto.Message)
	if field == "" || !ok || msg == nil {
		return false
	}
	fd := msg.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(field))
	return fd != nil && fd.Kind() == protoreflect.StringKind && !fd.IsList() && msg.ProtoReflect().Get(fd).String() != ""
}

// Retry policy of [ServiceConfig].
const (
	// retryMaxAttempts is grpc-go's cap: it lowers any higher value to 5.
	retryMaxAttempts = 5
)

// ServiceConfig returns the service config (JSON, for
// grpc.WithDefaultServiceConfig) recommended for calling methods served by
// idemgrpc with grpc-go's own retries. names are services
// ("rides.v1.Rides") or full method names ("/rides.v1.Rides/CreateRide"),
// and only ones idemgrpc serves: at least one is required. A retry policy
// for every method of the channel would also retry ABORTED and UNAVAILABLE
// answers of methods without idem, where a retry may repeat an effect.
//
// It retries UNAVAILABLE and ABORTED, the codes of the adapter's answers
// that invite a retry (in progress, a failed phase, a store that is down,
// a request unfinished at the deadline, a dropped connection), and no
// other: a retry of any other answer gets the same answer. It makes 5
// attempts, grpc-go's most, waiting what the server's pushback says
// (RetryInfo) or, after a transport failure, an exponential backoff from
// 0.25 s to 2 s. waitForReady makes an attempt sent while the server is
// down (killed, restarting) wait for it to come back, within the call's
// deadline, rather than fail at once and spend an attempt. Give every
// call a deadline: it bounds the retries and the waiting.
//
// The same key must go with every attempt: the channel re-sends the call's
// metadata, so a key from [UnaryClientInterceptor] or the caller's own is
// kept. docs/grpc.md says what the policy can and cannot do with each
// answer.
func ServiceConfig(names ...string) (string, error) {
	type name struct {
		Service string `json:"service,omitempty"`
		Method  string `json:"method,omitempty"`
	}
	var ns []name
	for _, n := range names {
		if strings.HasPrefix(n, "/") {
			service, method, ok := strings.Cut(n[1:], "/")
			if !ok || service == "" || method == "" || strings.Contains(method, "/") {
				return "", fmt.Errorf("idemgrpc: ServiceConfig: %q is not a method name such as /package.Service/Method", n)
			}
			ns = append(ns, name{Service: service, Method: method})
			continue
		}
		if n == "" || strings.Contains(n, "/") {
			return "", fmt.Errorf("idemgrpc: ServiceConfig: %q is not a service name such as package.Service", n)
		}
		ns = append(ns, name{Service: n})
	}
	if len(ns) == 0 {
		return "", errors.New("idemgrpc: ServiceConfig: name the services or methods idemgrpc serves: a policy for every method of the channel would retry methods without idem too")
	}
	sc := map[string]any{"methodConfig": []any{map[string]any{
		"name":         ns,
		"waitForReady": true,
		"retryPolicy": map[string]any{
			"maxAttempts":          retryMaxAttempts,
			"initialBackoff":       "0.25s",
			"maxBackoff":           "2s",
			"backoffMultiplier":    2,
			"retryableStatusCodes": []string{"UNAVAILABLE", "ABORTED"},
		},
	}}}
	b, err := json.Marshal(sc)
	if err != nil {
		return "", errors.New("idemgrpc: ServiceConfig: " + err.Error()) // unreachable: plain values
	}
	return string(b), nil
}

// Replayed reports whether an answer was replayed: the stored answer of an
// earlier attempt, not executed by this call. Pass the response header and,
// for an error status, the trailer (grpc.Header and grpc.Trailer call
// options); a replayed status carries the entry in its header.
func Replayed(md ...metadata.MD) bool {
	for _, m := range md {
		if v := m.Get(ReplayedHeader); len(v) == 1 && v[0] == "true" {
			return true
		}
	}
	return false
}

// ResponseKey returns the idempotency key an answer echoes, "" for none.
// Pass the response header and the trailer (grpc.Header and grpc.Trailer
// call options): a response carries it in its header, an error status in
// its trailer. Retry code that sends a failed call again takes its key
// from here (or keeps the one it sent).
func ResponseKey(md ...metadata.MD) string {
	for _, m := range md {
		if v := m.Get(MetadataKey); len(v) > 0 && v[0] != "" {
			return v[0]
		}
	}
	return ""
}
