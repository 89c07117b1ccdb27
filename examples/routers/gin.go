package routers

import (
	"net/http"

	"github.com/gin-gonic/gin"
)

// GinAuth stands for a gin authentication middleware: it keeps the caller
// in gin's context, which the *http.Request does not carry.
func GinAuth(c *gin.Context) {
	tenant := c.GetHeader("X-Tenant")
	if tenant == "" {
		c.AbortWithStatus(http.StatusUnauthorized)
		return
	}
	c.Set("user", User{ID: c.GetHeader("X-User"), Tenant: tenant})
	c.Next()
}

// Gin mounts orders, an idemhttp handler, on a gin engine.
func Gin(orders http.Handler) *gin.Engine {
	r := gin.New()
	r.POST("/orders", GinAuth, func(c *gin.Context) {
		// The bridge: what gin's middleware learned, in the request's context.
		c.Request = c.Request.WithContext(WithUser(c.Request.Context(), c.MustGet("user").(User)))
	}, gin.WrapH(orders))
	return r
}
