package idemgrpc_test

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/internal/testpb"
	"github.com/go-idem/idem/internal/canonical"
)

// fingerprint is the canonical JSON of an input of the orders flow: it is
// the same for inputs of the same value.
func fingerprint(t *testing.T, in orderInput) []byte {
	t.Helper()
	js, err := json.Marshal(in)
	require.NoError(t, err)
	fp, err := canonical.JSON(js)
	require.NoError(t, err)
	return fp
}

func TestInputSurvivesAJSONRoundTrip(t *testing.T) {
	t.Parallel()
	req := orderRequest()
	req.Quantity = math.MaxInt64 // beyond a double: protojson writes it as a string
	req.Priority = -3
	in := orderInput{Method: testpb.Orders_CreateOrder_FullMethodName, Message: req}

	js, err := json.Marshal(in)
	require.NoError(t, err)
	var out orderInput
	require.NoError(t, json.Unmarshal(js, &out))
	require.Equal(t, in.Method, out.Method)
	requireProtoEqual(t, req, out.Message)

	var generic map[string]any
	require.NoError(t, json.Unmarshal(js, &generic))
	require.Equal(t, testpb.Orders_CreateOrder_FullMethodName, generic["method"])
	msg := generic["message"].(map[string]any)
	require.Equal(t, "9223372036854775807", msg["quantity"], "int64 as protojson writes it: a string, exact")
	require.Contains(t, msg, "ship_to", "proto field names, not lowerCamelCase")
}

func TestInputFingerprintIsTheMessagesValue(t *testing.T) {
	t.Parallel()
	base := fingerprint(t, orderInput{Method: testpb.Orders_CreateOrder_FullMethodName, Message: orderRequest()})

	// The same value through the wire in another field order, with unknown
	// fields: the same fingerprint.
	decoded := &testpb.CreateOrderRequest{}
	wire := reversedFields(t, orderRequest())
	wire = append(wire, 0xf8, 0x06, 0x07) // field 111, varint 7: unknown to the message
	require.NoError(t, proto.Unmarshal(wire, decoded))
	require.NotEmpty(t, decoded.ProtoReflect().GetUnknown())
	require.Equal(t, base, fingerprint(t, orderInput{Method: testpb.Orders_CreateOrder_FullMethodName, Message: decoded}))

	// A map built in another order: the same.
	req := orderRequest()
	req.Labels = map[string]string{}
	for _, k := range []string{"c", "a", "b"} {
		req.Labels[k] = map[string]string{"a": "1", "b": "2", "c": "3"}[k]
	}
	require.Equal(t, base, fingerprint(t, orderInput{Method: testpb.Orders_CreateOrder_FullMethodName, Message: req}))

	// Any change of value, or another method: another fingerprint.
	changes := map[string]func(*testpb.CreateOrderRequest){
		"quantity": func(r *testpb.CreateOrderRequest) { r.Quantity++ },
		"label":    func(r *testpb.CreateOrderRequest) { r.Labels["a"] = "x" },
		"oneof":    func(r *testpb.CreateOrderRequest) { r.Payment = &testpb.CreateOrderRequest_Voucher{Voucher: "4242"} },
		"notes":    func(r *testpb.CreateOrderRequest) { r.Notes[0], r.Notes[1] = r.Notes[1], r.Notes[0] },
		"nested":   func(r *testpb.CreateOrderRequest) { r.ShipTo.City = "Lyon" },
		"key":      func(r *testpb.CreateOrderRequest) { r.RequestId = "other" },
	}
	for name, change := range changes {
		req := orderRequest()
		change(req)
		require.NotEqual(t, base, fingerprint(t, orderInput{Method: testpb.Orders_CreateOrder_FullMethodName, Message: req}), name)
	}
	require.NotEqual(t, base, fingerprint(t, orderInput{Method: testpb.Orders_CancelOrder_FullMethodName, Message: orderRequest()}))
}

func TestInputJSONErrors(t *testing.T) {
	t.Parallel()
	_, err := json.Marshal(orderInput{Method: "/a.B/C"})
	require.ErrorContains(t, err, "no message")

	var in orderInput
	require.NoError(t, json.Unmarshal([]byte(`null`), &in), "null is a no-op, as for any Unmarshaler")
	require.Nil(t, in.Message)
	require.ErrorContains(t, json.Unmarshal([]byte(`{"method": "/a.B/C"}`), &in), `no "message"`)
	require.ErrorContains(t, json.Unmarshal([]byte(`{"method": "/a.B/C", "message": {"quantity": "many"}}`), &in), "idemgrpc.test.v1.CreateOrderRequest")

	// A field a later deploy removed is ignored when a stored request is
	// decoded again.
	require.NoError(t, json.Unmarshal([]byte(`{"method": "/a.B/C", "message": {"sku": "x", "removed_field": 1}}`), &in))
	require.Equal(t, "x", in.Message.GetSku())

	// An interface type is not a message type to decode into.
	var generic idemgrpc.Input[proto.Message]
	require.ErrorContains(t, json.Unmarshal([]byte(`{"method": "/a.B/C", "message": {}}`), &generic), "not a concrete message type")
}
