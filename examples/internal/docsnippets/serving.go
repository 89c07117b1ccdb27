package docsnippets

import (
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
)

// serving holds docs/http.md and docs/webhooks.md, "Serving".
func serving(mux *http.ServeMux) *http.Server {
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,  // the headers
		ReadTimeout:       30 * time.Second, // headers and body: a read deadline for the body
		WriteTimeout:      60 * time.Second, // above Config.MaxWait and Config.DefaultWait (5 s)
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10, // Idempotency-Key is at most 255 characters
	}
	return srv
}

// stripePreset holds docs/webhooks.md, "Security", the Stripe preset.
func stripePreset(runner *idem.Runner, flow *idem.Flow[struct{}]) (*idemhttp.Webhook[struct{}], error) {
	verify, err := idemhttp.StripeSignature(strings.Split(os.Getenv("STRIPE_WEBHOOK_SECRETS"), ","), 0)
	if err != nil {
		log.Fatal(err) // an empty or short secret: refused before the first delivery
	}
	webhook, err := idemhttp.NewWebhook(runner, flow, &idemhttp.WebhookConfig{
		Provider: "stripe", EventID: idemhttp.JSONValue("id"), Verify: verify,
	})
	return webhook, err
}
