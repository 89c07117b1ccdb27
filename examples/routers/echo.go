package routers

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// EchoAuth stands for an echo authentication middleware: it keeps the
// caller in echo's context, which the *http.Request does not carry.
func EchoAuth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		tenant := c.Request().Header.Get("X-Tenant")
		if tenant == "" {
			return echo.ErrUnauthorized
		}
		c.Set("user", User{ID: c.Request().Header.Get("X-User"), Tenant: tenant})
		return next(c)
	}
}

// Echo mounts orders, an idemhttp handler, on an echo server.
func Echo(orders http.Handler) *echo.Echo {
	e := echo.New()
	e.POST("/orders", echo.WrapHandler(orders), EchoAuth, func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			// The bridge: what echo's middleware learned, in the request's context.
			c.SetRequest(c.Request().WithContext(WithUser(c.Request().Context(), c.Get("user").(User))))
			return next(c)
		}
	})
	return e
}
