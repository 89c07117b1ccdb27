package ridesapp

import (
	"encoding/json"
	"net/http"

	"github.com/go-idem/idem"
)

// Problem types of the rides API's own answers, as RFC 9457 problem
// documents. The idempotency errors (missing key, in progress, mismatch...)
// come from idemhttp and carry its types.
const (
	ProblemCardDeclined  = "https://github.com/go-idem/idem/blob/main/examples/rides/README.md#card-declined"
	ProblemPaymentFailed = "https://github.com/go-idem/idem/blob/main/examples/rides/README.md#payment-failed"
)

// Problem is an RFC 9457 problem document, with the ride it concerns when
// there is one.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	RideID int64  `json:"ride_id,omitempty"`
}

// respondProblem ends the flow with a stored problem response.
func respondProblem(status int, typ, title, detail string, rideID int64) idem.Result {
	body, err := json.Marshal(Problem{Type: typ, Title: title, Status: status, Detail: detail, RideID: rideID})
	if err != nil {
		// Unreachable: the struct always encodes. RespondJSON reports it as a
		// phase error if it ever did not.
		return idem.RespondJSON(status, nil)
	}
	return idem.Respond(status, http.Header{"Content-Type": {"application/problem+json"}}, body)
}
