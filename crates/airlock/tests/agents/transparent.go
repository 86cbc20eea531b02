// The transparent plane's Go client: HTTPS GETs with no proxy at all (its
// transport has no Proxy function: the environment is never read), one line
// per URL: "URL STATUS BODY" or "URL ERR why".
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Proxy: nil}}
	for _, u := range os.Args[1:] {
		r, err := c.Get(u)
		if err != nil {
			fmt.Printf("%s ERR %v\n", u, err)
			continue
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		fmt.Printf("%s %d %s\n", u, r.StatusCode, b)
	}
}
