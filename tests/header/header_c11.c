/* hixl.h must compile alone, as strict C11, and its symbols must link. */
#include <hixl.h>

int main(void)
{
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  if (hixl_ctx_transports(NULL) != NULL)
    return 1;
  return hixl_strerror(HIXL_ERR_ACCESS)[0] == 'H' ? 0 : 1;
}
