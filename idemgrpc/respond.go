package idemgrpc

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// ContentType is the media type of a response stored by [Respond] and
// [RespondStatus]: a binary protobuf message, whose full name is the
// media type's messageType parameter.
const ContentType = "application/x-protobuf"

// statusMessageName is the stored type of an error status.
const statusMessageName = "google.rpc.Status"

var deterministic = proto.MarshalOptions{Deterministic: true}

// Respond ends a flow with msg, the method's response message: it is
// stored with the phase's commit, sent with status OK, and replayed to every
// retry. msg must be of the method's response type.
//
// It returns the phase's two results, so a phase can end with
//
//	return idemgrpc.Respond(&ridespb.Ride{RideId: id, ChargeId: chargeID})
//
// The error is non-nil only when msg cannot be encoded (nil, or a string
// field that is not UTF-8); the phase then fails and stores nothing.
func Respond(msg proto.Message) (idem.Result, error) {
	if !validMessage(msg) {
		return idem.Result{}, errors.New("idemgrpc: Respond needs a message")
	}
	body, err := deterministic.Marshal(msg)
	if err != nil {
		return idem.Result{}, fmt.Errorf("idemgrpc: encode %s: %w", msg.ProtoReflect().Descriptor().FullName(), err)
	}
	name := string(msg.ProtoReflect().Descriptor().FullName())
	return idem.Respond(http.StatusOK, storedHeader(name), body), nil
}

// RespondStatus ends a flow with an error status: a final answer such as a
// declined card (codes.FailedPrecondition), stored with the phase's commit
// and replayed to every retry with the same code, message and details, like
// a response message. st must not be OK.
//
// A stored status is final: every retry gets it. For a failure the client
// should retry (a provider that timed out), return an error from the phase
// instead; nothing is stored and the retry resumes.
func RespondStatus(st *status.Status) (idem.Result, error) {
	if st == nil || st.Code() == codes.OK {
		return idem.Result{}, errors.New("idemgrpc: RespondStatus needs an error status; respond OK with Respond")
	}
	body, err := deterministic.Marshal(st.Proto())
	if err != nil {
		return idem.Result{}, fmt.Errorf("idemgrpc: encode status: %w", err)
	}
	return idem.Respond(HTTPStatus(st.Code()), storedHeader(statusMessageName), body), nil
}

func storedHeader(messageType string) http.Header {
	return http.Header{"Content-Type": {ContentType + `; messageType="` + messageType + `"`}}
}

// decodeStored turns a stored response back into the message or status it
// was made from. want is the method's response type.
func decodeStored[Resp proto.Message](resp *idemtype.Response, want string) (Resp, *status.Status, error) {
	var zero Resp
	if resp == nil {
		return zero, nil, errors.New("the outcome has no response")
	}
	mediaType, params, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err == nil && isJSON(mediaType) {
		return decodeStoredJSON[Resp](resp)
	}
	if err != nil || mediaType != ContentType {
		return zero, nil, fmt.Errorf("the stored response is %q, neither a protobuf message (idemgrpc.Respond) nor JSON (idem.RespondJSON)",
			resp.Header.Get("Content-Type"))
	}
	stored := params["messagetype"]
	if resp.Status == http.StatusOK {
		if stored != want {
			return zero, nil, fmt.Errorf("the stored response is a %s, but the method answers %s", stored, want)
		}
		msg, err := newMessage[Resp]()
		if err != nil {
			return zero, nil, err
		}
		if err := proto.Unmarshal(resp.Body, msg); err != nil {
			return zero, nil, fmt.Errorf("decode the stored %s: %w", want, err)
		}
		return msg, nil, nil
	}
	if stored != statusMessageName {
		return zero, nil, fmt.Errorf("the stored response has status %d but is a %s, not a %s", resp.Status, stored, statusMessageName)
	}
	var p spb.Status
	if err := proto.Unmarshal(resp.Body, &p); err != nil {
		return zero, nil, fmt.Errorf("decode the stored status: %w", err)
	}
	st := status.FromProto(&p)
	if st.Code() == codes.OK {
		return zero, nil, errors.New("the stored status is OK")
	}
	return zero, st, nil
}

// HTTPStatus is the HTTP status code stored with a response for a gRPC code,
// after the mapping in google/rpc/code.proto. idem keeps it with the key so
// that operators listing keys (the idem CLI, the key table) see at a glance
// what a request answered; clients never see it.
func HTTPStatus(c codes.Code) int {
	switch code.Code(c) {
	case code.Code_OK:
		return http.StatusOK
	case code.Code_CANCELLED:
		return 499
	case code.Code_INVALID_ARGUMENT, code.Code_FAILED_PRECONDITION, code.Code_OUT_OF_RANGE:
		return http.StatusBadRequest
	case code.Code_DEADLINE_EXCEEDED:
		return http.StatusGatewayTimeout
	case code.Code_NOT_FOUND:
		return http.StatusNotFound
	case code.Code_ALREADY_EXISTS, code.Code_ABORTED:
		return http.StatusConflict
	case code.Code_PERMISSION_DENIED:
		return http.StatusForbidden
	case code.Code_UNAUTHENTICATED:
		return http.StatusUnauthorized
	case code.Code_RESOURCE_EXHAUSTED:
		return http.StatusTooManyRequests
	case code.Code_UNIMPLEMENTED:
		return http.StatusNotImplemented
	case code.Code_UNAVAILABLE:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError // UNKNOWN, INTERNAL, DATA_LOSS and codes not defined yet
}

// isJSON reports whether a media type is JSON: application/json or any
// +json type (application/problem+json).
func isJSON(mediaType string) bool {
	return mediaType == "application/json" || (strings.HasPrefix(mediaType, "application/") && strings.HasSuffix(mediaType, "+json"))
}

// strictJSON decodes a stored JSON answer into the response message: every
// member must be a field of it, so that an answer shaped otherwise is a
// reported error rather than an empty message.
var strictJSON = protojson.UnmarshalOptions{}

// decodeStoredJSON turns a stored JSON response, such as a flow that serves
// HTTP too stores (idem.RespondJSON), into what a gRPC client gets: a 2xx
// body decoded into the response message with protojson (member names are
// the fields' proto or JSON names), any other status into an error status
// (see StatusCode) whose message is the body's "detail" or "title" member
// (an RFC 9457 problem), or else the HTTP status text.
func decodeStoredJSON[Resp proto.Message](resp *idemtype.Response) (Resp, *status.Status, error) {
	var zero Resp
	if resp.Status >= 200 && resp.Status <= 299 {
		msg, err := newMessage[Resp]()
		if err != nil {
			return zero, nil, err
		}
		if len(bytes.TrimSpace(resp.Body)) == 0 {
			return msg, nil, nil
		}
		if err := strictJSON.Unmarshal(resp.Body, msg); err != nil {
			return zero, nil, fmt.Errorf("decode the stored JSON answer into %s: %w", msg.ProtoReflect().Descriptor().FullName(), err)
		}
		return msg, nil, nil
	}
	var problem struct {
		Title  string `json:"title"`
		Detail string `json:"detail"`
	}
	_ = json.Unmarshal(resp.Body, &problem) // a body of another shape has no message to give
	msg := cmp.Or(problem.Detail, problem.Title, http.StatusText(resp.Status), fmt.Sprintf("HTTP status %d", resp.Status))
	return zero, status.New(StatusCode(resp.Status), msg), nil
}

// StatusCode is the gRPC code a gRPC client gets for a final answer a flow
// stored as JSON with an HTTP status other than 2xx (a flow that serves
// both transports, see docs/grpc.md): 400 INVALID_ARGUMENT, 401
// UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND, 409 ALREADY_EXISTS,
// 429 RESOURCE_EXHAUSTED, 499 CANCELLED, 501 UNIMPLEMENTED, 503 UNAVAILABLE,
// 504 DEADLINE_EXCEEDED; any other 4xx (402, 412, 422: a refusal that
// depends on the state of things, such as a declined card) is
// FAILED_PRECONDITION, any other status INTERNAL. It reverses [HTTPStatus]
// where that is one to one.
func StatusCode(httpStatus int) codes.Code {
	switch httpStatus {
	case http.StatusBadRequest:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusConflict:
		return codes.AlreadyExists
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case 499:
		return codes.Canceled
	case http.StatusNotImplemented:
		return codes.Unimplemented
	case http.StatusServiceUnavailable:
		return codes.Unavailable
	case http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	}
	if httpStatus >= 400 && httpStatus <= 499 {
		return codes.FailedPrecondition
	}
	return codes.Internal
}
