/*
 * client_check.c - drives every call of libpjserve-client against a real
 * server for tests/client (filled in by the next change).
 */
int main(void)
{
    return 0;
}
